#!/usr/bin/env bash
# The GPU validation batch, run from the repository root of a GPU machine with prebuilt binaries.
# Raw output goes to OUT_DIR, under the untracked results/ folder (e.g. results/<batch>/<part>); the batch is
# summarized in docs/validation/gpu_batch_<date>.md (GPU kind, date, commands, figures and the sha256 of each
# archive), since CI has no GPU.
#
#   scripts/gpu_batch.sh PART BIN_DIR OUT_DIR [PROFILE]
#
# BIN_DIR holds a CUDA build's threewalls, backend_tests, kernel_bench, profiler_overhead and lib/
# (shared libraries the GPU machine lacks: SimGrid and its dependencies, toml++). PART is one of
#   calibrate   environment, backend tests, calibration_bench_gpu_tests, kernel_bench (KERNEL_BENCH_S
#               seconds, 0 skips it), `threewalls calibrate` (full; FILL_FROM=PROFILE passes --fill-from)
#               -> OUT/<kind>_profile.toml
#   validate    validate_suite.py over the fidelity suite with PROFILE (+ examples, key checks, faults)
#   studies     validate_suite.py over the host-overhead and offload suites with PROFILE
#               (NVMe tier: NVME_SCENARIOS names or "none", NVME_STEPS steps, NVME_TIMEOUT seconds;
#               ONLY_NVME=1 runs the NVMe tier alone; RECALIBRATE=host: a quick host-only calibration
#               before each host-overhead scenario; HO_REPEAT processes per host-overhead scenario,
#               default 3 (launch-bound steps differ from process to process: host_overhead.md);
#               HOST_OVERHEAD_TIMEOUT seconds for that suite, default 420)
#   memory      scripts/memory_check.py on GPU 0: the one-GPU fidelity scenarios and the two memory-boundary
#               scenarios (scenarios/validation/memory/), modelled peak against the caching allocator's
#               allocated / reserved peaks and the device-wide peak, and the OOM verdict on both sides
#   mpi         `mpirun -np N threewalls run` of small_moe_ep4 (ep2 on 2 GPUs) with a record-key check
#               against `sim` on PROFILE, a wrong world size, and an injected failing rank
#   nccl        kernel_bench's NCCL bus bandwidth (64 MiB-1 GiB) on 2 and on all GPUs, with NCCL's
#               defaults and with each setting of NCCL_SWEEP (space-separated VAR=VALUE[,VAR=VALUE])
# SKIP_FAULTS=1 leaves the injected-fault runs out of `validate` (they cost about 70 s).
# Each step has its own time limit so one hang cannot eat the others' output.
set -u
PART=${1:?PART}
BIN=$(cd "${2:?BIN_DIR}" && pwd)
OUT=${3:?OUT_DIR}
PROFILE=${4:-}
. "$(dirname "$0")/results_dir.sh"
refuse_tracked_out "$OUT"
# Scenario-relative lookup would resolve a relative profile path against each scenario's folder.
[ -n "$PROFILE" ] && PROFILE=$(realpath "$PROFILE")
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export THREEWALLS_SOURCE_DIR="$PWD"
# Carried libraries only where the machine lacks them (system copies stay in charge).
. "$(dirname "$0")/carried_libs.sh"
link_carried_libs "$BIN" "$BIN"/threewalls "$BIN"/threewalls-gpu "$BIN"/libthreewalls_simgrid.so "$BIN"/backend_tests
LIBS=$CARRIED_LIBS
TW="$BIN/threewalls"
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
KIND=h100
nvidia-smi -L | grep -q H200 && KIND=h200
log="$OUT/${PART}_${KIND}.log"
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }

case "$PART" in
calibrate)
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvidia-smi topo -m
    echo "missing before carrying: $(ls "$LIBS" | tr '\n' ' ')"
    step "backend_tests (kernel correctness against CPU references; NCCL on $NGPU GPUs)"
    timeout 150 "$BIN/backend_tests" > "$OUT/backend_tests.txt" 2>&1
    echo "backend_tests rc=$?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|rel_error" "$OUT/backend_tests.txt" | head -80
    tail -5 "$OUT/backend_tests.txt"
    if [ "${KERNEL_BENCH_S:-120}" -gt 0 ]; then
      step "kernel_bench (grouped vs dense GEMM, NCCL bus bandwidth, pinned copies)"
      timeout "${KERNEL_BENCH_S:-120}" "$BIN/kernel_bench" 2>&1 | tail -120
    fi
    if [ -x "$BIN/calibration_bench_gpu_tests" ]; then
      step "calibration_bench_gpu_tests (every calibration op on a small point, with its check)"
      timeout 150 "$BIN/calibration_bench_gpu_tests" > "$OUT/calibration_gpu_tests.txt" 2>&1
      echo "calibration_bench_gpu_tests rc=$?"
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$OUT/calibration_gpu_tests.txt" | head -20
    fi
    fill=()
    [ -n "${FILL_FROM:-}" ] && fill=(--fill-from "$(realpath "$FILL_FROM")")
    step "threewalls calibrate (full) on $NGPU GPUs ${fill[*]}"
    /usr/bin/time -v timeout 420 "$TW" calibrate --out "$OUT/${KIND}_profile.toml" --raw-out "$OUT/raw" "${fill[@]}" 2> "$OUT/calibrate_time.txt"
    echo "rc=$?"
    grep -E "Elapsed|Maximum resident" "$OUT/calibrate_time.txt"
    step done
  } > "$log" 2>&1
  tar cJf "$OUT/calibration_raw_${KIND}.tar.xz" -C "$OUT" raw 2>/dev/null && rm -rf "$OUT/raw"
  ;;
validate)
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    step "fidelity suite"
    timeout 420 python3 scripts/validate_suite.py --bin "$TW" --kind "$KIND" --profile "$PROFILE" \
      --out "$OUT/fidelity_$KIND" scenarios/validation/fidelity
    echo "rc=$?"
    step "example scenarios that fit this machine, with record-key checks against the simulator"
    for s in scenarios/examples/small_moe_*.toml scenarios/examples/deepseek_v2_lite_offload.toml; do
      n=$(basename "$s" .toml)
      w=$(python3 -c "import sys; sys.path.insert(0, 'scripts'); import validate_suite as v; print(v.world_size(sys.argv[1]))" "$s")
      if [ "$w" -gt "$NGPU" ]; then echo "skip $n: needs $w GPUs, machine has $NGPU"; continue; fi
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((w - 1))) timeout 90 "$TW" run "$s" --out "$OUT/ex/real_$n" > "$OUT/ex_$n.txt" 2>&1; rc=$?
      echo "run $n rc=$rc"; tail -12 "$OUT/ex_$n.txt"
      if [ $rc -eq 0 ]; then
        "$TW" sim "$s" --calibration "$PROFILE" --out "$OUT/ex/sim_$n" > /dev/null 2>&1
        scripts/check_record_keys.sh "$OUT/ex/sim_$n" "$OUT/ex/real_$n" 2>&1 | tail -5
      fi
    done
    if [ "$NGPU" -ge 2 ] && [ "${SKIP_FAULTS:-0}" != 1 ]; then
      step "a failing rank (rank 1 fails at step 1) makes the others exit with a clear error"
      timeout 120 "$TW" run scenarios/examples/small_moe_ep2.toml --out "$OUT/ex/fail" --steps 3 --inject-fault fail:1:1 2>&1 | tail -6
      echo "rc=${PIPESTATUS[0]} (3 expected)"
      step "a hanging rank (rank 1 hangs at step 1): the others time out and abort"
      timeout 120 "$TW" run scenarios/examples/small_moe_ep2.toml --out "$OUT/ex/hang" --steps 3 --inject-fault hang:1:1 --timeout 10s 2>&1 | tail -6
      echo "rc=${PIPESTATUS[0]} (3 expected)"
    fi
    step "profiler overhead on small_moe_1gpu"
    CUDA_VISIBLE_DEVICES=0 timeout 150 "$BIN/profiler_overhead" scenarios/examples/small_moe_1gpu.toml 20 3 /tmp/tw_overhead 2>&1 | tail -12
    step done
  } > "$log" 2>&1
  # Pack the run directories: the device tool returns a bounded number of files.
  (cd "$OUT" && tar cJf "examples_$KIND.tar.xz" ex ex_*.txt) && rm -rf "$OUT/ex" "$OUT"/ex_*.txt
  [ -d "$OUT/fidelity_$KIND" ] && cp "$OUT/fidelity_$KIND/fidelity.md" "$OUT/fidelity_$KIND.md" &&
    cp "$OUT/fidelity_$KIND/runs.tar.xz" "$OUT/fidelity_runs_$KIND.tar.xz" && cp "$OUT/fidelity_$KIND/results.json" "$OUT/fidelity_results_$KIND.json" &&
    rm -rf "$OUT/fidelity_$KIND"
  ;;
memory)
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    step "peak memory: modelled against allocated, reserved and device-wide; the OOM verdict"
    CUDA_VISIBLE_DEVICES=0 timeout 540 python3 scripts/memory_check.py --bin "$TW" --profile "$PROFILE" \
      --out "$OUT/memory_$KIND"
    echo "rc=$?"
    step done
  } 2>&1 | tee "$log"
  ;;
studies)
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    if [ "${ONLY_NVME:-0}" != 1 ]; then
      recal=()
      [ -n "${RECALIBRATE:-}" ] && recal=(--recalibrate "$RECALIBRATE")
      step "host-overhead study (Switch-like layers) ${recal[*]}"
      timeout "${HOST_OVERHEAD_TIMEOUT:-420}" python3 scripts/validate_suite.py --bin "$TW" --kind "$KIND" --profile "$PROFILE" \
        "${recal[@]}" --repeat "${HO_REPEAT:-3}" --out "$OUT/host_overhead_$KIND" scenarios/validation/host_overhead
      echo "rc=$?"
      step "expert-offload study (DeepSeek-V2-Lite decode), host tier, one scenario at a time"
      CUDA_VISIBLE_DEVICES=0 timeout 280 python3 scripts/validate_suite.py --bin "$TW" --kind "$KIND" --profile "$PROFILE" \
        --out "$OUT/offload_$KIND" scenarios/validation/offload/*host_pinned*.toml
      echo "rc=$?"
    fi
    # An NVMe-tier decode step reads ~8 GB (~5.6 s on the H100 machine's virtual disk): fewer steps.
    if [ "${NVME_SCENARIOS:-}" != none ]; then
      step "expert-offload study, NVMe tier: ${NVME_SCENARIOS:-all four}, --steps ${NVME_STEPS:-7}"
      nvme=()
      for n in ${NVME_SCENARIOS:-barrier_none barrier_next_layer per_expert_none per_expert_next_layer}; do
        nvme+=("scenarios/validation/offload/dsv2lite_nvme_$n.toml")
      done
      CUDA_VISIBLE_DEVICES=0 timeout "${NVME_TIMEOUT:-300}" python3 scripts/validate_suite.py --bin "$TW" --kind "$KIND" \
        --profile "$PROFILE" --steps "${NVME_STEPS:-7}" --out "$OUT/offload_nvme_$KIND" "${nvme[@]}"
      echo "rc=$?"
    fi
    step done
  } > "$log" 2>&1
  for d in host_overhead offload offload_nvme; do
    [ -d "$OUT/${d}_$KIND" ] && cp "$OUT/${d}_$KIND/runs.tar.xz" "$OUT/${d}_runs_$KIND.tar.xz" &&
      cp "$OUT/${d}_$KIND/fidelity.md" "$OUT/${d}_$KIND.md" && rm -rf "$OUT/${d}_$KIND"
  done
  ;;
mpi)
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    mpirun --version 2>&1 | head -1
    sc=scenarios/examples/small_moe_ep4.toml
    [ "$NGPU" -lt 4 ] && sc=scenarios/examples/small_moe_ep2.toml
    n=$(basename "$sc" .toml)
    w=$(python3 -c "import sys; sys.path.insert(0, 'scripts'); import validate_suite as v; print(v.world_size(sys.argv[1]))" "$sc")
    mpi=(mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x THREEWALLS_SOURCE_DIR)
    step "mpirun -np $w threewalls run $n (one process per GPU, NCCL id broadcast over MPI)"
    timeout 150 "${mpi[@]}" -np "$w" "$TW" run "$sc" --out "$OUT/mpi/real_$n" 2>&1 | tail -40
    echo "mpirun rc=${PIPESTATUS[0]}"
    ls "$OUT/mpi/real_$n"
    "$TW" sim "$sc" --calibration "$PROFILE" --out "$OUT/mpi/sim_$n" > /dev/null 2>&1
    scripts/check_record_keys.sh "$OUT/mpi/sim_$n" "$OUT/mpi/real_$n" 2>&1 | tail -5
    step "mpirun -np $((w / 2)) with the $w-GPU scenario: a clear refusal"
    timeout 60 "${mpi[@]}" -np $((w / 2)) "$TW" run "$sc" --out "$OUT/mpi/wrong_world" 2>&1 | tail -12
    echo "mpirun rc=${PIPESTATUS[0]} (non-zero expected)"
    step "a failing rank under MPI (rank 1 fails at step 1): MPI_Abort stops the job"
    timeout 120 "${mpi[@]}" -np "$w" "$TW" run "$sc" --out "$OUT/mpi/fail" --steps 3 --inject-fault fail:1:1 2>&1 | tail -12
    echo "mpirun rc=${PIPESTATUS[0]} (non-zero expected)"
    step done
  } > "$log" 2>&1
  (cd "$OUT" && tar cJf "mpi_runs_$KIND.tar.xz" mpi) && rm -rf "$OUT/mpi"
  ;;
nccl)
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi topo -m
    for n in 2 "$NGPU"; do
      [ "$n" -gt "$NGPU" ] && continue
      devs=$(seq -s, 0 $((n - 1)))
      for setting in default ${NCCL_SWEEP:-}; do
        step "kernel_bench --only nccl on $n GPUs, $setting"
        vars=()
        [ "$setting" != default ] && IFS=, read -r -a vars <<< "$setting"
        env "${vars[@]}" CUDA_VISIBLE_DEVICES="$devs" timeout 90 "$BIN/kernel_bench" --only nccl 2>&1 | grep -E "all_|FAILED|skipped"
      done
      [ "$n" -eq "$NGPU" ] && break
    done
    step done
  } > "$log" 2>&1
  ;;
*)
  echo "unknown PART $PART" >&2
  exit 2
  ;;
esac
ls -la "$OUT"
