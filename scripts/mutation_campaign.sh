#!/usr/bin/env bash
# The scenario mutation campaign in parallel: scripts/mutate_scenarios.py (mutants of the shipped and
# validation scenarios through load -> expand -> simulate, each under a time and memory limit) in N
# jobs with seeds SEED, SEED+1, ..., the count split between them, then one summary of all jobs:
# counts by outcome, the slowest mutants and every finding (crash, hang, memory, nan, sim-rejected).
#
# Usage: scripts/mutation_campaign.sh BUILD_DIR [--jobs N] [--count C] [--seed S] [--out DIR]
#                                     [--timeout S] [--mem-mb M] [--minutes M] [--batch B]
#   BUILD_DIR  a build with tests/fuzz/scenario_sim_runner (cmake --build BUILD_DIR --target scenario_sim_runner)
#   --jobs     parallel jobs (default: the CPUs of the affinity mask); each child sim is single-threaded
#   --count    mutants in all (default 5000)
#   --out      where reports, logs and kept findings go (default BUILD_DIR/mutation-campaign)
#   --timeout  seconds per mutant (default 60); --mem-mb address-space limit per mutant (default 4096)
#   --minutes  each job stops making mutants after this long (0, the default: no limit) and still
#              writes its report: for machines that limit a command's time (run the rest with other seeds)
#   --batch    mutants per runner call (default 5); a job may overrun --minutes by a batch of --timeout each
# Exit status 1 when any job found something; the summary is OUT/summary.txt and OUT/summary.json.
# Reports are named by seed (OUT/job<seed>.json), and the summary joins every report in OUT: calls
# with other --seed values into the same --out add up to one campaign.
# With 16 jobs, keep --jobs x --mem-mb within the machine's memory (16 x 4096 MiB = 64 GiB).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build=""
jobs="$(nproc)"
count=5000
seed=20261127
out=""
timeout=60
mem=4096
minutes=0
batch=5
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs="$2"; shift 2 ;;
    --count) count="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --mem-mb) mem="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "mutation_campaign: unknown option $1 (allowed: --jobs --count --seed --out --timeout --mem-mb --minutes --batch)" >&2; exit 2 ;;
    *) if [ -z "$build" ]; then build="$1"; shift; else echo "mutation_campaign: one build directory expected, got also $1" >&2; exit 2; fi ;;
  esac
done
if [ -z "$build" ]; then echo "usage: scripts/mutation_campaign.sh BUILD_DIR [--jobs N] [--count C]" >&2; exit 2; fi
build="$(cd "$build" && pwd)"
runner="$build/tests/fuzz/scenario_sim_runner"
if [ ! -x "$runner" ]; then echo "mutation_campaign: $runner not built (cmake --build $build --target scenario_sim_runner)" >&2; exit 2; fi
case "$jobs" in ''|*[!0-9]*|0) echo "mutation_campaign: --jobs must be a positive integer (got $jobs)" >&2; exit 2 ;; esac
case "$count" in ''|*[!0-9]*|0) echo "mutation_campaign: --count must be a positive integer (got $count)" >&2; exit 2 ;; esac
out="${out:-$build/mutation-campaign}"
mkdir -p "$out"
per=$(( (count + jobs - 1) / jobs ))
echo "mutation_campaign: $count mutants in $jobs jobs of $per (seeds $seed..$((seed + jobs - 1))), $timeout s and $mem MiB each; $out"
start=$(date +%s)
pids=()
for ((i = 0; i < jobs; i++)); do
  n=$per
  if [ $(( (i + 1) * per )) -gt "$count" ]; then n=$(( count - i * per )); fi
  [ "$n" -gt 0 ] || continue
  j=$((seed + i))
  python3 "$root/scripts/mutate_scenarios.py" "$runner" --count "$n" --seed "$j" --timeout "$timeout" \
    --mem-mb "$mem" --minutes "$minutes" --batch "$batch" --keep "$out/job$j" --report "$out/job$j.json" --quiet \
    > "$out/job$j.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
elapsed=$(( $(date +%s) - start ))
python3 - "$out" "$elapsed" "$jobs" <<'EOF' | tee "$out/summary.txt"
import glob, json, os, sys
out, elapsed, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
reports = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "job*.json")))]
counts, slowest, findings = {}, [], []
for r in reports:
    for k, v in r["counts"].items():
        counts[k] = counts.get(k, 0) + v
    slowest += r["slowest"]
    findings += r["findings"]
slowest.sort(key=lambda s: -s["seconds"])
mutants = sum(r["mutants"] for r in reports)
summary = {"mutants": mutants, "jobs": jobs, "reports": len(reports), "wall_s": elapsed, "counts": counts,
           "slowest": slowest[:20], "findings": findings}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("mutants %d in %d jobs (%d reports), %d s wall" % (mutants, jobs, len(reports), elapsed))
print("by outcome: " + ", ".join("%s %d" % kv for kv in sorted(counts.items())))
bad = {k: v for k, v in counts.items() if k not in ("ok", "rejected")}
print("findings: " + (", ".join("%s %d" % kv for kv in sorted(bad.items())) or "none"))
print("slowest mutants:")
for s in slowest[:10]:
    print("  %7.2f s  %-12s %s: %s" % (s["seconds"], s["verdict"], s["seed"], s["edits"][:160]))
for f in findings:
    print("FINDING %s: %s (%s; %s)" % (f["verdict"], f["kept"], f["seed"], "; ".join(f["edits"])[:200]))
logs = len(glob.glob(os.path.join(out, "job*.log")))
if len(reports) < logs:
    print("WARNING: %d of %d jobs wrote no report (see %s/job*.log)" % (logs - len(reports), logs, out))
EOF
exit $status
