#!/usr/bin/env bash
# Wall time and peak RSS of `threewalls sim` per example scenario, and how they grow with the cluster:
# DeepSeek-V3-shaped (PP16, EP up to 64) and Mixtral-shaped (PP4, EP8) training scenarios generated
# for 64 to 8,192 GPUs with a fixed number of micro-batches per step (the same work per rank, so the
# growth is the simulator's own). One step each, flow fidelity unless --fidelity analytic.
#
#   bench/sim_scaling.sh [--bin build/cli/threewalls] [--fidelity flow|analytic] [--max-gpus 8192]
#
# Targets (docs/simulator.md): DeepSeek-V3 on 2,048 GPUs <= 10 s and <= 4 GiB; Mixtral-8x7B on
# 64 GPUs <= 1 s. Prints one line per run: scenario, GPUs, rank classes, seconds, peak RSS in MiB.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$here/build/cli/threewalls"
fidelity="flow"
max_gpus=8192
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --fidelity) fidelity="$2"; shift 2 ;;
    --max-gpus) max_gpus="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "sim_scaling.sh: unknown argument '$1' (allowed: --bin, --fidelity, --max-gpus)" >&2; exit 2 ;;
  esac
done
[[ -x "$bin" ]] || { echo "sim_scaling.sh: no threewalls binary at $bin (build it, or pass --bin)" >&2; exit 2; }
[[ "$fidelity" == flow || "$fidelity" == analytic ]] || { echo "sim_scaling.sh: --fidelity must be flow or analytic" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "sim_scaling.sh: needs /usr/bin/time (Debian package 'time')" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# run NAME GPUS FILE -> prints "NAME GPUS CLASSES SECONDS RSS_MIB", returns the seconds in $last_s and
# the RSS in $last_mib.
run() {
  local name="$1" gpus="$2" file="$3"
  local out
  if ! out="$( { /usr/bin/time -f 'TIME %e %M' "$bin" sim "$file" --no-run-dir --steps 1 --fidelity "$fidelity"; } 2>&1 )"; then
    printf '%-34s %6s  FAILED: %s\n' "$name" "$gpus" "$(echo "$out" | grep -v '^TIME' | tail -1)"
    last_s=nan; last_mib=nan
    return 0
  fi
  local classes secs kib
  classes="$(echo "$out" | sed -n 's/.*, \([0-9]*\) rank classes.*/\1/p' | head -1)"
  read -r secs kib < <(echo "$out" | sed -n 's/^TIME \([0-9.]*\) \([0-9]*\)$/\1 \2/p')
  last_s="$secs"
  last_mib="$(awk -v k="$kib" 'BEGIN { printf "%.0f", k / 1024 }')"
  printf '%-34s %6s %8s %9s %9s\n' "$name" "$gpus" "$classes" "$secs" "$last_mib"
}

# A copy of an example with cluster nodes, ep and global batch replaced.
scaled() {
  local src="$1" name="$2" nodes="$3" ep="$4" gbs="$5"
  sed -e "s/^name = .*/name = \"$name\"/" -e "s/^nodes = .*/nodes = $nodes/" -e "s/^ep = .*/ep = $ep/" \
      -e "s/^global_batch_size = .*/global_batch_size = $gbs/" "$here/scenarios/examples/$src" > "$work/$name.toml"
  echo "$work/$name.toml"
}

echo "threewalls sim scaling ($fidelity fidelity, one step; $(nproc) cores)"
printf '%-34s %6s %8s %9s %9s\n' scenario GPUs classes seconds RSS_MiB
for f in "$here"/scenarios/examples/*.toml; do
  n="$(basename "$f" .toml)"
  gpus="$(awk -F= '/^gpus_per_node/ {g=$2} /^nodes/ {n=$2} END {print g*n}' "$f")"
  run "$n" "$gpus" "$f"
  case "$n" in
    deepseek_v3_2048gpu) ds_s="$last_s"; ds_mib="$last_mib" ;;
    mixtral_8x7b_64gpu) mx_s="$last_s" ;;
  esac
done

echo
echo "growth with the cluster (fixed micro-batches per step: 60 for DeepSeek-V3, 16 for Mixtral)"
printf '%-34s %6s %8s %9s %9s\n' scenario GPUs classes seconds RSS_MiB
for gpus in 64 256 1024 2048 4096 8192; do
  (( gpus <= max_gpus )) || continue
  nodes=$(( gpus / 8 ))
  # DeepSeek-V3 shape: PP16, dp = gpus / 16, EP = min(64, dp).
  dp=$(( gpus / 16 )); ep=$(( dp < 64 ? dp : 64 ))
  run "deepseek_v3_shape_${gpus}" "$gpus" "$(scaled deepseek_v3_2048gpu.toml "deepseek_v3_shape_${gpus}" "$nodes" "$ep" $(( 60 * dp )))"
  # Mixtral shape: PP4 EP8, dp = gpus / 4.
  dp=$(( gpus / 4 ))
  run "mixtral_shape_${gpus}" "$gpus" "$(scaled mixtral_8x7b_64gpu.toml "mixtral_shape_${gpus}" "$nodes" 8 $(( 16 * dp )))"
done

echo
verdict() { awk -v v="$1" -v lim="$2" 'BEGIN { if (v == "nan") print "FAILED"; else if (v + 0 <= lim + 0) print "ok"; else print "OVER" }'; }
echo "target: DeepSeek-V3 2048 GPUs <= 10 s: ${ds_s:-nan} s $(verdict "${ds_s:-nan}" 10); <= 4096 MiB: ${ds_mib:-nan} MiB $(verdict "${ds_mib:-nan}" 4096)"
echo "target: Mixtral-8x7B 64 GPUs <= 1 s: ${mx_s:-nan} s $(verdict "${mx_s:-nan}" 1)"
