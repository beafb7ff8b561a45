#!/usr/bin/env bash
# Runs `sim` of each scenario with two threewalls binaries and says SAME when their run directories
# agree byte for byte (summary.json, every phases_rank_*.jsonl) and so does the printed summary, but
# for what names the build and the run: git_sha, tool_version, run_id, start_time, the wall time and
# the calibration profile's path (each build's own checkout).
# For a change that must not move a prediction (docs/performance.md).
#
#   bench/compare_sim_outputs.sh BIN_A BIN_B [SCENARIO...] [-- SIM_ARGS...]
#
# Default scenarios: scenarios/examples/*.toml and scenarios/validation/scale/*.toml. Both binaries
# write the same --out path in turn (the run directory's argv is part of its header). Exit 1 on any
# difference.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
bins=("$1" "$2")
shift 2
scenarios=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do scenarios+=("$1"); shift; done
[ $# -gt 0 ] && shift
sim_args=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(scenarios/examples/*.toml scenarios/validation/scale/*.toml)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out="$work/run"
normalized() {
  sed -E 's/"(git_sha|run_id|start_time|tool_version)": ?"[^"]*"/"\1":"-"/g;
          s/("calibration_profile":\{"id":"[^"]*","path":)"[^"]*"/\1"-"/' "$1"
}
status=0
for scenario in "${scenarios[@]}"; do
  name=$(basename "$scenario" .toml)
  for side in 0 1; do
    rm -rf "$out"
    "${bins[$side]}" sim "$scenario" --out "$out" --overwrite "${sim_args[@]}" 2>&1 | grep -v "^simulated in" \
      > "$work/$side.stdout"
    echo "exit ${PIPESTATUS[0]}" >> "$work/$side.stdout"
    rm -rf "$work/$side"
    if [ -d "$out" ]; then mv "$out" "$work/$side"; else mkdir "$work/$side"; fi
  done
  verdict=SAME
  files=$(cd "$work/0" && ls summary.json phases_rank_*.jsonl 2>/dev/null)
  [ "$files" == "$(cd "$work/1" && ls summary.json phases_rank_*.jsonl 2>/dev/null)" ] || verdict="DIFFERENT (files)"
  if [ "$verdict" == SAME ]; then
    for f in $files; do
      cmp -s <(normalized "$work/0/$f") <(normalized "$work/1/$f") || { verdict="DIFFERENT ($f)"; break; }
    done
  fi
  cmp -s "$work/0.stdout" "$work/1.stdout" || verdict="$verdict, printed summary DIFFERENT"
  echo "$verdict $name ($(echo "$files" | wc -w) files)"
  [ "$verdict" == SAME ] || status=1
done
exit $status
