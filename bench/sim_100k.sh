#!/usr/bin/env bash
# DeepSeek-V3 on 100,352 H100 (12,544 nodes of 8): the 1,024-GPU example's model and layout (TP2 PP8
# VPP4 EP64, expert DP 196) with the data-parallel size grown to 6,272 and the global batch to 100,352
# sequences (16 micro-batches per DP rank; 100,352 is the first world size past 100,000 that
# tp x pp x ep = 1,024 divides). One step, flow fidelity, a run directory written. Prints the summary's
# first lines, then wall time, CPU time and peak RSS of the simulation.
#
#   bench/sim_100k.sh [--bin build/cli/threewalls] [--slow RANK]
#
# --slow RANK adds a [[cluster.slowdown]] of factor 1.5 on that rank (its classes are refined: see
# docs/stepgraph.md) and runs `threewalls analyze` on the run directory afterwards.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$here/build/cli/threewalls"
slow=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --slow) slow="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "sim_100k.sh: unknown argument '$1' (allowed: --bin, --slow)" >&2; exit 2 ;;
  esac
done
[[ -x "$bin" ]] || { echo "sim_100k.sh: no threewalls binary at $bin (build it, or pass --bin)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "sim_100k.sh: needs /usr/bin/time (Debian package 'time')" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
scenario="$work/deepseek_v3_100k.toml"
sed -e 's/^name = "deepseek_v3_1024gpu"/name = "deepseek_v3_100k"/' \
    -e 's/^nodes = 128$/nodes = 12544/' \
    -e 's/^global_batch_size = 15360$/global_batch_size = 100352/' \
    "$here/scenarios/examples/deepseek_v3_1024gpu.toml" > "$scenario"
grep -q '^nodes = 12544$' "$scenario" && grep -q '^global_batch_size = 100352$' "$scenario" ||
  { echo "sim_100k.sh: the 1,024-GPU example changed shape; update the sed lines" >&2; exit 2; }
if [[ -n "$slow" ]]; then
  printf '\n[[cluster.slowdown]]\nrank = %s\nfactor = 1.5\n' "$slow" > "$work/slow.toml"
  # The slowdown table goes before [run] (TOML: a table's keys end where the next table starts).
  awk -v add="$(cat "$work/slow.toml")" '/^\[run\]$/ && !done { print add; print ""; done = 1 } { print }' \
    "$scenario" > "$scenario.new" && mv "$scenario.new" "$scenario"
fi
"$bin" validate "$scenario"
/usr/bin/time -f 'wall %e s, user %U s, sys %S s, peak RSS %M KiB' \
  "$bin" sim "$scenario" --out "$work/run" --steps 1 2>&1 | sed -n '1,6p;/^simulated in/p;/^wall /p'
if [[ -n "$slow" ]]; then "$bin" analyze "$work/run" | head -30; fi
