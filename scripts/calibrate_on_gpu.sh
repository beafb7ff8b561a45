#!/usr/bin/env bash
# Calibration on a GPU machine from binaries built elsewhere (docs/calibration.md, "Running a calibration").
#
#   scripts/calibrate_on_gpu.sh pack BUILD_DIR CARRY_DIR
#       Copies threewalls, threewalls-gpu (which threewalls execs for run and calibrate),
#       libthreewalls_simgrid.so (which flow-fidelity simulations load) and calibration_bench_gpu_tests from BUILD_DIR into CARRY_DIR (and,
#       where built, threewalls_merge_families, to merge the measured families into a profile on the GPU
#       machine, and backend_tests, kernel_bench and profiler_overhead for scripts/gpu_batch.sh), with the shared
#       libraries they need that a bare GPU machine may lack (everything `ldd` resolves outside the CUDA
#       toolkit, the driver and glibc) in CARRY_DIR/lib. Run on the build machine.
#   scripts/calibrate_on_gpu.sh run CARRY_DIR OUT_DIR [threewalls calibrate options...]
#       On the GPU machine, from the repository root: records the environment (date, nvidia-smi, topology)
#       in OUT_DIR/env.txt, runs the GPU tests of the driver (OUT_DIR/gpu_tests.txt), then
#       `threewalls calibrate --out OUT_DIR/<kind>.toml --raw-out OUT_DIR/raw <options>` (OUT_DIR/calibrate.txt).
#       The lead copies OUT_DIR/<kind>.toml to calibration/profiles/<kind>.toml and summarizes the outputs
#       in docs/validation/calibration_<kind>_<date>.md; OUT_DIR itself stays outside the tracked tree
#       (results/, untracked).
# Environment: CALIBRATE_TIMEOUT (seconds, default 420), TESTS_TIMEOUT (default 150).
set -u
mode=${1:?"usage: $0 pack BUILD_DIR CARRY_DIR | run CARRY_DIR OUT_DIR [options]"}
shift

if [ "$mode" = pack ]; then
  build=${1:?BUILD_DIR}
  carry=${2:?CARRY_DIR}
  mkdir -p "$carry/lib"
  # Those the calibration needs, then, where built, the merge tool and those scripts/gpu_batch.sh runs.
  for b in cli/threewalls cli/threewalls-gpu cli/libthreewalls_simgrid.so tests/calibration/calibration_bench_gpu_tests \
           calibration/threewalls_merge_families tests/backend/backend_tests backend/kernel_bench bench/profiler_overhead; do
    case "$b" in
      cli/*|tests/calibration/*)
        [ -x "$build/$b" ] || { echo "missing $build/$b (build targets threewalls, threewalls-gpu and calibration_bench_gpu_tests)"; exit 2; } ;;
      *) [ -x "$build/$b" ] || continue ;;
    esac
    cp "$build/$b" "$carry/"
    strip --strip-debug "$carry/$(basename "$b")"
    ldd "$build/$b" | awk '/=> \// {print $3}' | while read -r lib; do
      case "$lib" in
        /usr/local/cuda*|*/libcuda.so*|*/libnvidia*|*/libc.so*|*/libm.so*|*/libpthread*|*/libdl.so*|*/librt.so*|*/ld-linux*) ;;
        *) cp -L "$lib" "$carry/lib/" ;;
      esac
    done
  done
  du -sh "$carry"
  exit 0
fi

[ "$mode" = run ] || { echo "unknown mode '$mode': use pack or run"; exit 2; }
carry=${1:?CARRY_DIR}
out=${2:?OUT_DIR}
. "$(dirname "$0")/results_dir.sh"
refuse_tracked_out "$out"
shift 2
export NCCL_NVLS_ENABLE=0   # NVLink multicast off (see the device notes); recorded in env.txt
. "$(dirname "$0")/carried_libs.sh"
link_carried_libs "$carry" "$carry/threewalls" "$carry/threewalls-gpu" "$carry/libthreewalls_simgrid.so" "$carry/calibration_bench_gpu_tests"
export THREEWALLS_SOURCE_DIR="$PWD"
mkdir -p "$out"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  ldd "$carry/threewalls" "$carry/threewalls-gpu" | grep -E "not found|cublas|nccl|cudart|toml|simgrid"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
if [ -x "$carry/calibration_bench_gpu_tests" ]; then
  timeout "${TESTS_TIMEOUT:-150}" "$carry/calibration_bench_gpu_tests" > "$out/gpu_tests.txt" 2>&1
  echo "calibration_bench_gpu_tests rc=$?" | tee -a "$out/gpu_tests.txt"
  grep -E "^\[  (FAILED|PASSED|SKIPPED|  OK) |Failure|Expected|Which is|: error" "$out/gpu_tests.txt" | head -40
fi
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$name" in
  *H200*) kind=h200 ;;
  *H100*) kind=h100 ;;
  *) kind=unknown ;;
esac
timeout "${CALIBRATE_TIMEOUT:-420}" "$carry/threewalls" calibrate --out "$out/$kind.toml" --raw-out "$out/raw" "$@" \
  > "$out/calibrate.txt" 2>&1
echo "threewalls calibrate rc=$?" | tee -a "$out/calibrate.txt"
grep -vE "^\[ *[0-9]+/[0-9]+\]" "$out/calibrate.txt" | tail -80
