#!/usr/bin/env bash
# Does the host's speed depend on which CPU the rank thread runs on? (launch-bound steps
# differ by 20-70% between processes on the GPU VMs; docs/validation/host_overhead.md.)
# Runs one launch-bound scenario once per CPU, the process pinned to that CPU (`taskset -c`), ROUNDS
# times, and then UNPINNED processes without pinning; prints per run the CPU, the run's host probe
# (run.json: op launch and GEMM calls in us, then the CPU alone: cpu_chain_us, cpu_copy_GBps,
# cpu_load_ns) and
# its median step time.
#
#   scripts/host_cpu_sweep.sh BIN_DIR OUT_DIR [SCENARIO] [ROUNDS] [UNPINNED]
#
# The run's own host probe (run.json) measures the host's speed in the process that runs the steps,
# so no calibration per CPU is needed.
# BIN_DIR as for gpu_batch.sh (threewalls and lib/). Default scenario: the d1024 1k-token sequential
# Switch layer without graphs; 2 rounds; 8 unpinned processes. WRAP (e.g. "setarch -R": no address
# space randomisation) prefixes the unpinned runs, which are then labelled with it.
set -u
BIN=$(cd "${1:?BIN_DIR}" && pwd)
OUT=${2:?OUT_DIR}
SC=${3:-scenarios/validation/host_overhead/switch_d1024_t1k_sequential_none.toml}
ROUNDS=${4:-2}
UNPINNED=${5:-8}
. "$(dirname "$0")/results_dir.sh"
refuse_tracked_out "$OUT"
mkdir -p "$OUT"
. "$(dirname "$0")/carried_libs.sh"
link_carried_libs "$BIN" "$BIN"/threewalls "$BIN"/threewalls-gpu
report() {  # run dir, label
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
d, label = sys.argv[1], sys.argv[2]
try:
    run = json.load(open(d + "/run.json"))
    s = json.load(open(d + "/summary.json"))
except OSError as e:
    print(f"{label} failed: {e}")
    sys.exit()
p = run["settings"]["executor"]["device"].get("host_probe", {})
step = s["step_time_us"]["median"] / 1000.0
probe = " ".join(f"{v:.2f}" for k, v in p.items() if k.endswith("_us") and not k.startswith("cpu_"))
cpu = " ".join(f"{k} {p[k]:.2f}" for k in ("cpu_chain_us", "cpu_copy_GBps", "cpu_load_ns") if k in p)
print(f"{label} probe_us {probe} {cpu} step_ms {step:.3f}")
PY
}
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|NUMA)" 
n=$(nproc)
for r in $(seq 1 "$ROUNDS"); do
  for c in $(seq 0 $((n - 1))); do
    taskset -c "$c" timeout 60 "$BIN/threewalls" run "$SC" --out "$OUT/r${r}_cpu$c" --steps 8 > /dev/null 2>&1
    report "$OUT/r${r}_cpu$c" "round $r cpu $c"
  done
done
for i in $(seq 1 "$UNPINNED"); do
  ${WRAP:-} timeout 60 "$BIN/threewalls" run "$SC" --out "$OUT/unpinned_$i" --steps 8 > /dev/null 2>&1
  report "$OUT/unpinned_$i" "unpinned${WRAP:+ ($WRAP)} $i"
done
