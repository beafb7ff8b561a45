#!/usr/bin/env bash
# Does the host's speed depend on the CPU a process runs on? For each CPU of CPUS: REPS real runs of
# SCENARIO pinned there (taskset) and a quick host-only calibration pinned there, then REPS unpinned
# runs. Prints the step-time median of each run and the calibration's kernel launch, one-node GEMM
# call and recording path. For a GPU machine (docs/validation/host_overhead.md).
#
#   scripts/host_affinity_probe.sh THREEWALLS PROFILE SCENARIO OUT [CPUS] [REPS]
set -u
TW=${1:?threewalls binary}; PROFILE=$(realpath "${2:?profile}"); S=${3:?scenario}; OUT=${4:?out dir}
CPUS=${5:-"1 5 9 13"}; REPS=${6:-2}
mkdir -p "$OUT"
median() { python3 -c "import json,sys; print('%.3f' % (json.load(open(sys.argv[1]))['step_time_us']['median'] / 1000))" "$1/summary.json"; }
host() {
  python3 -c "
import sys; sys.path.insert(0, 'scripts'); import validate_suite as v
h = v.host_figures(sys.argv[1]); print(' / '.join('%.2f' % h[k] for k in ('kernel_launch_us', 'gemm_call_us', 'record_op_us')))" "$1"
}
echo "scenario $S; nproc $(nproc); $(date -u +%H:%M:%S)"
for cpu in $CPUS unpinned; do
  pin=(taskset -c "$cpu"); [ "$cpu" = unpinned ] && pin=()
  line="cpu $cpu: steps (ms)"
  for r in $(seq 1 "$REPS"); do
    d="$OUT/run_${cpu}_$r"
    if "${pin[@]}" "$TW" run "$S" --out "$d" > "$d.txt" 2>&1; then line+=" $(median "$d")"; else line+=" failed"; fi
  done
  if [ "$cpu" != unpinned ]; then
    "${pin[@]}" "$TW" calibrate --quick --only host --fill-from "$PROFILE" --out "$OUT/host_$cpu.toml" > "$OUT/host_$cpu.txt" 2>&1 &&
      line+="; host kernel launch / GEMM call / record (us) $(host "$OUT/host_$cpu.toml")"
  fi
  echo "$line"
done
echo "done $(date -u +%H:%M:%S)"
