#!/bin/bash
# Does a continuous `threewalls run` reach the GPU's power limit, and how much slower are its steps?
# Runs each scenario on GPU 0 twice, with its own steps and with 80, nvidia-smi reading the SM clock,
# power and temperature every 100 ms (reading only), and prints each run's step times (first and last
# five, median) and the median gap between steps (docs/validation/sustained_clocks_h200_2026-11-29.md).
#
#   scripts/sustained_clocks_backend.sh THREEWALLS_GPU_BIN OUT_DIR SCENARIO.toml...
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 THREEWALLS_GPU_BIN OUT_DIR SCENARIO.toml..." >&2
  exit 2
fi
bin=$1 out=$2
shift 2
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -i 0 \
  -lms 100 > "$out/smi.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
sleep 2
for scenario in "$@"; do
  name=$(basename "$scenario" .toml)
  for how in default long; do
    extra=()
    [ "$how" = long ] && extra=(--steps 80)
    date -u +%T.%N > "$out/t_${name}_${how}_start"
    "$bin" run "$scenario" --out "$out/${name}_$how" --devices 0 "${extra[@]}" > "$out/${name}_$how.log" 2>&1
    date -u +%T.%N > "$out/t_${name}_${how}_end"
    sleep 5
  done
done
for d in "$out"/*_default "$out"/*_long; do
  python3 - "$d" <<'PY'
import json, sys
d = sys.argv[1]
st = [json.loads(l) for l in open(d + "/phases_rank_0.jsonl") if l.strip() and '"record":"step"' in l]
durs = [s["dur_us"] / 1000 for s in st]
gaps = [(st[i + 1]["epoch_us"] - st[i]["epoch_us"] - st[i]["dur_us"]) / 1000 for i in range(len(st) - 1)]
med = lambda x: sorted(x)[len(x) // 2]
print(d.split("/")[-1], "steps", len(durs), "dur ms first 5", [round(x, 2) for x in durs[:5]], "last 5",
      [round(x, 2) for x in durs[-5:]], "median", round(med(durs), 2), "gap ms median", round(med(gaps), 3) if gaps else None)
PY
done
