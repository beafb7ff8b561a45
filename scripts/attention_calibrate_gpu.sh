#!/usr/bin/env bash
# The fused and decode attention families (attention_fused.fwd, attention_fused.bwd, attention_decode;
# docs/calibration.md) for a shipped profile, from one short GPU run per GPU kind instead of a new full
# calibration.
#
#   scripts/attention_calibrate_gpu.sh pack BUILD_DIR CARRY_DIR
#       On the build machine (a CUDA build with targets threewalls and calibration_bench_gpu_tests):
#       scripts/calibrate_on_gpu.sh pack.
#   scripts/attention_calibrate_gpu.sh run CARRY_DIR OUT_DIR [threewalls calibrate options...]
#       On the GPU machine, repository root; builds nothing. scripts/calibrate_on_gpu.sh run with
#       `--only attention --no-fill`: OUT_DIR/env.txt, the GPU tests of the benchmark driver (every op's
#       smallest point, the fused and decode attention ones included: OUT_DIR/gpu_tests.txt), then the
#       calibrate group `attention` (unfused, fused and decode attention, full grid, a measurement budget
#       of ATTENTION_BUDGET_S seconds, default 200: the whole call stays inside a 10-minute device call)
#       into OUT_DIR/<kind>.toml (those families only) and OUT_DIR/raw/ (OUT_DIR/calibrate.txt).
#   scripts/attention_calibrate_gpu.sh merge BUILD_DIR OUT_DIR [PROFILE]
#       On the build machine: BUILD_DIR/calibration/threewalls_merge_families writes PROFILE (default
#       calibration/profiles/<kind>.toml, <kind> from OUT_DIR/<kind>.toml) with the three families from
#       OUT_DIR/<kind>.toml, refitted with PROFILE's hardware and copy.d2d; PROFILE's other families
#       stay as they are. Then regenerate the goldens (scripts/update_goldens.sh BUILD_DIR): the shipped
#       examples' fused and decode attention are costed by the new families.
# Environment: ATTENTION_BUDGET_S; as scripts/calibrate_on_gpu.sh, CALIBRATE_TIMEOUT (default here 360)
# and TESTS_TIMEOUT (150).
set -u
mode=${1:?"usage: $0 pack BUILD_DIR CARRY_DIR | run CARRY_DIR OUT_DIR [options] | merge BUILD_DIR OUT_DIR [PROFILE]"}
shift
here=$(dirname "$0")
families=(attention_fused.fwd attention_fused.bwd attention_decode)

case "$mode" in
  pack)
    exec "$here/calibrate_on_gpu.sh" pack "$@" ;;
  run)
    carry=${1:?CARRY_DIR}
    out=${2:?OUT_DIR}
    shift 2
    # calibrate's summary (the tail calibrate_on_gpu.sh prints) gives each family's fit, leave-one-out
    # and held-out errors.
    TESTS_TIMEOUT=${TESTS_TIMEOUT:-150} CALIBRATE_TIMEOUT=${CALIBRATE_TIMEOUT:-360} \
      exec "$here/calibrate_on_gpu.sh" run "$carry" "$out" --only attention --no-fill \
      --budget-seconds "${ATTENTION_BUDGET_S:-200}" "$@" ;;
  merge)
    build=${1:?BUILD_DIR}
    out=${2:?OUT_DIR}
    tool="$build/calibration/threewalls_merge_families"
    [ -x "$tool" ] || { echo "missing $tool (build target threewalls_merge_families)"; exit 2; }
    fragment=""
    for f in "$out"/h100.toml "$out"/h200.toml; do
      [ -f "$f" ] && fragment="$f"
    done
    [ -n "$fragment" ] || { echo "no $out/h100.toml or $out/h200.toml: run 'run' on the GPU machine first"; exit 2; }
    kind=$(basename "$fragment" .toml)
    profile=${3:-calibration/profiles/$kind.toml}
    "$tool" "$profile" "$fragment" "$profile" "${families[@]}" ;;
  *)
    echo "unknown mode '$mode': use pack, run or merge"; exit 2 ;;
esac
