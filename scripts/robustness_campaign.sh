#!/usr/bin/env bash
# The robustness campaigns of docs/fuzzing.md in one call, for a machine of many cores: the five input
# surfaces past the loader (scripts/mutate_inputs.py: rundir, profile, megatron, hf, plan-merge), one
# process each for --minutes, and the scenario mutation campaign (scripts/mutation_campaign.sh:
# --count mutants through load -> expand -> simulate) on the remaining cores, all at once; then one
# summary: counts by outcome per surface and every finding with the file it was kept in.
#
#   scripts/robustness_campaign.sh pack BUILD_DIR PACK_DIR
#       On the build machine: copies what the campaign runs into PACK_DIR, laid out as a build folder:
#       cli/threewalls, tests/fuzz/scenario_sim_runner (each with libthreewalls_simgrid.so beside it,
#       debug info stripped), lib/ (the shared libraries they load that a bare machine may lack:
#       everything ldd resolves outside glibc; scripts/carried_libs.sh links only the missing ones)
#       and seeds/ (the rundir and plan-merge seeds, made here with BUILD_DIR/cli/threewalls, which
#       finds the calibration profiles only in the source tree it was built from).
#       Build first: cmake --build BUILD_DIR --target threewalls scenario_sim_runner (RelWithDebInfo: -O2).
#   scripts/robustness_campaign.sh run BUILD_OR_PACK_DIR OUT_DIR [--minutes M] [--count C] [--jobs N]
#                                      [--seed S] [--timeout S]
#       From the repository root (scenarios, calibration profiles and these scripts are read from the
#       checkout; python3 with its standard library only): the five surfaces for M minutes each
#       (default 9; a second call with another --seed tops them up), and C scenario mutants (default
#       5000) in N - 5 jobs (N: default the CPUs of the affinity mask; 1 job when N <= 6).
#       --timeout: seconds per scenario mutant (default 180: a mutant of the largest validation seed,
#       Qwen3-235B on 256 GPUs, simulates 2 steps in about 130 s on one core of a 2-core VM); input
#       mutants get 20 s. Mutants run one per runner call, and the scenario jobs start their last
#       mutant by M minutes less one --timeout, so the call ends within about M minutes + 30 s.
#       Writes OUT_DIR/summary.txt and summary.json, the per-surface reports and logs, and the kept
#       findings (OUT_DIR/<surface>/, OUT_DIR/scenario/job*/). Exit status 1 on any finding.
# Memory: each input mutant runs under 2 GiB of address space and each scenario mutant under 4 GiB,
# so 16 CPUs need about 5 x 2 + 11 x 4 = 54 GiB at most.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
surfaces=(rundir profile megatron hf plan-merge)
usage() { sed -n '2,27p' "$0"; }

mode="${1:-}"
[ $# -gt 0 ] && shift
if [ "$mode" = pack ]; then
  [ $# -eq 2 ] || { usage >&2; exit 2; }
  build="$(cd "$1" && pwd)"
  pack="$2"
  for b in cli/threewalls tests/fuzz/scenario_sim_runner cli/libthreewalls_simgrid.so; do
    [ -f "$build/$b" ] || { echo "robustness_campaign: missing $build/$b (cmake --build $build --target threewalls scenario_sim_runner)" >&2; exit 2; }
  done
  rm -rf "$pack"
  mkdir -p "$pack/cli" "$pack/tests/fuzz" "$pack/lib"
  pack="$(cd "$pack" && pwd)"
  for b in cli/threewalls tests/fuzz/scenario_sim_runner; do
    cp "$build/$b" "$pack/$b"
    cp "$build/cli/libthreewalls_simgrid.so" "$pack/$(dirname "$b")/"
  done
  for f in "$pack"/cli/* "$pack"/tests/fuzz/*; do strip --strip-debug "$f"; done
  ldd "$pack/cli/threewalls" "$pack/tests/fuzz/scenario_sim_runner" "$pack/cli/libthreewalls_simgrid.so" |
    awk '/=> \// {print $3}' | sort -u | while read -r lib; do
      case "$lib" in
        */libc.so*|*/libm.so*|*/libpthread*|*/libdl.so*|*/librt.so*|*/ld-linux*) ;;
        *) cp -L "$lib" "$pack/lib/" ;;
      esac
    done
  python3 "$root/scripts/mutate_inputs.py" "$build" --make-seeds "$pack/seeds"
  du -sh "$pack"
  exit 0
fi
if [ "$mode" != run ]; then usage >&2; exit 2; fi

build=""
out=""
minutes=9
count=5000
jobs="$(nproc)"
seed=20261128
timeout=180
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --count) count="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "robustness_campaign: unknown option $1 (allowed: --minutes --count --jobs --seed --timeout)" >&2; exit 2 ;;
    *) if [ -z "$build" ]; then build="$1"; elif [ -z "$out" ]; then out="$1"; else
         echo "robustness_campaign: unexpected argument $1" >&2; exit 2; fi; shift ;;
  esac
done
[ -n "$build" ] && [ -n "$out" ] || { usage >&2; exit 2; }
case "$jobs" in ''|*[!0-9]*) echo "robustness_campaign: --jobs must be an integer (got $jobs)" >&2; exit 2 ;; esac
[ "$jobs" -ge 1 ] || { echo "robustness_campaign: --jobs must be positive" >&2; exit 2; }
scenario_jobs=$(( jobs > 6 ? jobs - 5 : 1 ))
build="$(cd "$build" && pwd)"
runner="$build/tests/fuzz/scenario_sim_runner"
[ -x "$runner" ] || { echo "robustness_campaign: $runner missing (build it, or pack a build)" >&2; exit 2; }
if [ -d "$build/lib" ]; then
  . "$root/scripts/carried_libs.sh"
  link_carried_libs "$build" "$build/cli/threewalls" "$runner" "$build/tests/fuzz/libthreewalls_simgrid.so"
  missing=$(ldd "$runner" "$build/tests/fuzz/libthreewalls_simgrid.so" | awk '/not found/ {print $1}' | sort -u)
  [ -z "$missing" ] || { echo "robustness_campaign: libraries not found: $missing" >&2; exit 2; }
fi
seeds=()
[ -d "$build/seeds" ] && seeds=(--seeds "$build/seeds")
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# The scenario jobs stop starting mutants one --timeout (and 15 s) before the surfaces stop.
scenario_minutes=$(awk -v m="$minutes" -v t="$timeout" 'BEGIN { s = m - (t + 15) / 60; if (s < 0.25) s = 0.25; printf "%.2f", s }')
echo "robustness_campaign: surfaces ${surfaces[*]} for $minutes min each, $count scenario mutants in $scenario_jobs jobs for at most $scenario_minutes min (seed $seed); $out"
start=$(date +%s)
pids=()
for s in "${surfaces[@]}"; do
  python3 "$root/scripts/mutate_inputs.py" "$build" --surface "$s" --minutes "$minutes" --count 100000000 \
    --seed "$seed" --timeout 20 --mem-mb 2048 --batch 1 --keep "$out/$s" --report "$out/$s.seed$seed.json" \
    "${seeds[@]}" --quiet > "$out/$s.seed$seed.log" 2>&1 &
  pids+=($!)
done
"$root/scripts/mutation_campaign.sh" "$build" --jobs "$scenario_jobs" --count "$count" --seed "$seed" \
  --minutes "$scenario_minutes" --batch 1 --timeout "$timeout" --out "$out/scenario" > "$out/scenario.seed$seed.log" 2>&1 &
pids+=($!)
for p in "${pids[@]}"; do wait "$p" || true; done
elapsed=$(( $(date +%s) - start ))
python3 - "$out" "$elapsed" <<'EOF' | tee "$out/summary.txt"
import glob, json, os, sys
out, elapsed = sys.argv[1], int(sys.argv[2])
surfaces = ["rundir", "profile", "megatron", "hf", "plan-merge"]
rows, findings, missing = [], [], []
for s in surfaces:
    reports = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "%s.seed*.json" % s)))]
    if not reports:
        missing.append(s)
    counts = {}
    for r in reports:
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
        findings += [dict(f, surface=s) for f in r["findings"]]
    rows.append({"surface": s, "calls": len(reports), "mutants": sum(r["mutants"] for r in reports),
                 "minutes": round(sum(r["minutes"] for r in reports), 2), "counts": counts})
scen_path = os.path.join(out, "scenario", "summary.json")
if os.path.exists(scen_path):
    sc = json.load(open(scen_path))
    rows.append({"surface": "scenario", "calls": sc["reports"], "mutants": sc["mutants"],
                 "minutes": round(sc["wall_s"] / 60, 2), "counts": sc["counts"]})
    findings += [dict(f, surface="scenario") for f in sc["findings"]]
else:
    missing.append("scenario")
summary = {"wall_s": elapsed, "surfaces": rows, "findings": findings, "missing_reports": missing}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("robustness campaign: %d s wall (this call); totals over every call into %s" % (elapsed, out))
print("%-10s %6s %9s %8s %9s %9s  %s" % ("surface", "calls", "mutants", "minutes", "rejected", "accepted", "findings"))
for r in rows:
    c = r["counts"]
    bad = ", ".join("%s %d" % kv for kv in sorted(c.items()) if kv[0] not in ("ok", "rejected")) or "none"
    mins = "%.2f" % r["minutes"] + ("w" if r["surface"] == "scenario" else "")
    print("%-10s %6d %9d %8s %9d %9d  %s" % (r["surface"], r["calls"], r["mutants"], mins, c.get("rejected", 0),
                                             c.get("ok", 0), bad))
print("(minutes: per process; the scenario row's is the last call's wall time, 'w', over all its jobs)")
for f in findings:
    print("FINDING %s %s: %s (%s)" % (f["surface"], f["verdict"], f["kept"], "; ".join(f["edits"])[:200]))
if missing:
    print("WARNING: no report from %s (see %s/*.log)" % (", ".join(missing), out))
sys.exit(1 if findings or missing else 0)
EOF
