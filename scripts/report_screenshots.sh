#!/usr/bin/env bash
# The HTML report (threewalls export --format html) in three cases, each rendered to a PNG with
# headless Chromium (scripts/render_report.sh), as kept in docs/images/:
#   report_1step.png       a simulated pipeline run with one recorded step (mixtral_8x7b_64gpu, --steps 1)
#   report_steps.png       the same scenario with 10 recorded steps
#   report_sim_vs_real.png two runs compared: the synthetic pair of docs/compare_analyze_export.md
#                          (bench/synthetic_run: a "sim" run and a "real"-labelled run with 8% more time,
#                          noise and a slow rank), since no real GPU run ships with the repository
# Usage: scripts/report_screenshots.sh BUILD_DIR OUT_DIR   (BUILD_DIR has cli/threewalls and bench/synthetic_run)
# Run from the repository root (the scenarios are named relative to it).
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build=$(readlink -f "$1")
out=$(readlink -m "$2")
here=$(cd "$(dirname "$0")" && pwd)
tw="$build/cli/threewalls"
synthetic="$build/bench/synthetic_run"
for b in "$tw" "$synthetic"; do
  [[ -x "$b" ]] || { echo "$0: $b not built (cmake --build BUILD --target threewalls synthetic_run)" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/tw-report.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
scenario=scenarios/examples/mixtral_8x7b_64gpu.toml

"$tw" sim "$scenario" --steps 1 --fidelity analytic --out "$work/one" >/dev/null
"$tw" export "$work/one" --format html --out "$work/one.html" >/dev/null
"$here/render_report.sh" "$work/one.html" "$out/report_1step.png" 1320 1500

"$tw" sim "$scenario" --steps 10 --fidelity analytic --out "$work/ten" >/dev/null
"$tw" export "$work/ten" --format html --out "$work/ten.html" >/dev/null
"$here/render_report.sh" "$work/ten.html" "$out/report_steps.png" 1320 2300

"$synthetic" "$work/sim_run" ranks=8 steps=10 layers=4 microbatches=2 slow_rank=5 \
  slow_phase=moe_experts_fwd slow_factor=2 slow_from=3 slow_to=6 noise=0.01 >/dev/null
"$synthetic" "$work/real_run" source=real ranks=8 steps=10 layers=4 microbatches=2 time_scale=1.08 noise=0.02 seed=3 >/dev/null
"$tw" export "$work/sim_run" "$work/real_run" --format html --out "$work/pair.html" >/dev/null
"$here/render_report.sh" "$work/pair.html" "$out/report_sim_vs_real.png" 1320 5600
