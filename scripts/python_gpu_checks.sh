#!/usr/bin/env bash
# The Python package's checks on a GPU machine with PyTorch (docs/python.md), about 5 minutes on one
# H100:
#   1. installs the package from this checkout into a temporary folder (pip install --no-deps
#      --no-build-isolation --target: no network needed);
#   2. measures the profiler's overhead in a PyTorch MoE training loop, grouped and eager experts:
#      the same loop without the profiler, recording every 10th step and every step, interleaved
#      repeats (python3 -m threewalls.bench.overhead) -> OUT/overhead/overhead_{grouped,eager}.json;
#   3. runs the reference runner on the GPU scenarios (scenarios/examples/small_moe_1gpu.toml and
#      python/scenarios/*.toml; with 2 or more GPUs also small_moe_ep2 and the two-GPU scenarios of
#      python/scenarios/ep2/, on 2 processes, each with --wall-json) -> OUT/runs/<name>/;
#   4. with THREEWALLS=<threewalls binary>, simulates each scenario and compares:
#      OUT/sim/<name>/, OUT/compare/<name>.{txt,json};
#   5. measures PyTorch's host costs (python3 -m threewalls.bench.framework) against the shipped
#      profile of the GPU (PROFILE=<profile.toml> to choose another) -> OUT/framework/framework.json and
#      framework_families.toml; with threewalls_merge_families beside THREEWALLS (or MERGE=<binary>)
#      refits host.framework_op, host.framework_backward_op, host.framework_sync and
#      host.framework_autograd_op into
#      OUT/framework/profile_pytorch.toml, with PyTorch's kernels for the memory-bound ops (python3 -m threewalls.bench.pytorch_kernels ->
#      OUT/framework/pytorch_kernels/, refitted with threewalls_refit_raw beside the merge tool or
#      REFIT=<binary>) in it too; the runs of scenarios
#      with run.framework = "pytorch_eager" are simulated again with it: OUT/sim_pytorch/<name>/,
#      OUT/compare_pytorch/<name>.{txt,json};
#   6. profiles the first python/scenarios run with torch.profiler (--torch-profile) and imports
#      the trace (python3 -m threewalls.importers kineto) -> OUT/kineto/<name>.json, OUT/kineto/<name>_run/,
#      and compares it with the runner's own records and with the simulation;
#   7. where transformers is installed (not with --cpu-smoke), runs transformers' own OlmoeForCausalLM
#      (python/scenarios/hf/olmoe_4l_hf.toml with --hf-config, docs/python.md) and compares it with
#      the simulation like the runs of 3. and 4.
# Prints a summary and writes OUT/checks.json. The CUDA runs keep NVLink multicast off.
#
#   scripts/python_gpu_checks.sh OUT_DIR            # on the GPU machine
#   scripts/python_gpu_checks.sh OUT_DIR --cpu-smoke  # the same plumbing on a CPU with tiny sizes (CI)
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [--cpu-smoke]" >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$1
shift
smoke=0
for a in "$@"; do
  case "$a" in
    --cpu-smoke) smoke=1 ;;
    *) usage ;;
  esac
done
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "$out: exists and is not empty; results are never overwritten" >&2
  exit 2
fi
mkdir -p "$out"/overhead "$out"/runs "$out"/logs
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

t_start=$(date +%s)
# 1. Install (from a copy, so the build leaves nothing in the checkout).
mkdir -p "$tmp/src"
cp -r "$repo/python/pyproject.toml" "$repo/python/README.md" "$repo/python/threewalls" "$tmp/src/"
"$python" -m pip install --quiet --no-build-isolation --no-deps --no-cache-dir --target "$tmp/site" "$tmp/src" \
  > "$out/logs/pip.log" 2>&1 || { cat "$out/logs/pip.log" >&2; exit 1; }
export PYTHONPATH="$tmp/site"
"$python" - <<'EOF' | tee "$out/logs/environment.txt"
import threewalls, torch
print(f"threewalls {threewalls.__version__} from {threewalls.__file__}")
print(f"torch {torch.__version__}, CUDA devices: {torch.cuda.device_count()}",
      f"({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "")
print(f"torch._grouped_mm: {hasattr(torch, '_grouped_mm')}")
EOF
if [ "$smoke" = 1 ]; then
  ngpu=0
else
  ngpu=$("$python" -c 'import torch; print(torch.cuda.device_count())')
  if [ "$ngpu" -lt 1 ]; then
    echo "no CUDA device: run on a GPU machine, or pass --cpu-smoke" >&2
    exit 1
  fi
fi

# 2. Profiler overhead.
if [ "$smoke" = 1 ]; then
  tiny=(--device cpu --repeats 2 --steps 2 --warmup 1 --layers 2 --hidden 64 --heads 4 --experts-n 8 --ffn 32
        --topk 2 --seq 32 --vocab 256)
  "$python" -m threewalls.bench.overhead --out "$out/overhead" --experts grouped "${tiny[@]}"
  "$python" -m threewalls.bench.overhead --out "$out/overhead" --experts eager "${tiny[@]}"
else
  "$python" -m threewalls.bench.overhead --out "$out/overhead" --experts grouped --repeats 5 --steps 20
  "$python" -m threewalls.bench.overhead --out "$out/overhead" --experts eager --repeats 3 --steps 8 --warmup 2
fi

# 5. (first: the runs below use it) PyTorch's host costs, as profile families.
mkdir -p "$out/framework"
gpu_kind=$("$python" -c 'import torch; n = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""; print("h200" if "H200" in n else "h100")')
profile=${PROFILE:-$repo/calibration/profiles/$gpu_kind.toml}
if [ "$smoke" = 1 ]; then
  "$python" -m threewalls.bench.framework --out "$out/framework" --profile "$profile" --device cpu --ops 100 --repeats 3
else
  "$python" -m threewalls.bench.framework --out "$out/framework" --profile "$profile"
fi
merge=${MERGE:-}
if [ -z "$merge" ] && [ -n "${THREEWALLS:-}" ]; then
  for m in "$(dirname "$THREEWALLS")/threewalls_merge_families" "$(dirname "$THREEWALLS")/../calibration/threewalls_merge_families"; do
    [ -x "$m" ] && { merge=$m; break; }
  done
fi
pytorch_profile=
if [ -n "$merge" ]; then
  # The families bench.framework measured: its printed merge command's, after the three paths.
  fw_families=$(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["merge"].split()[4:]))' \
    "$out/framework/framework.json")
  # shellcheck disable=SC2086
  "$merge" "$profile" "$out/framework/framework_families.toml" "$out/framework/profile_pytorch.toml" $fw_families \
    > "$out/logs/merge_families.log" 2>&1 && pytorch_profile=$out/framework/profile_pytorch.toml ||
    { echo "threewalls_merge_families failed (logs/merge_families.log)" >&2; cat "$out/logs/merge_families.log" >&2; }
fi
# PyTorch's kernels for the memory-bound ops and its host time per op body (the pytorch.* and
# pytorch_host.* families), refitted into the same profile
# with threewalls_refit_raw beside the merge tool (or REFIT=<binary>).
if [ "$smoke" = 1 ]; then
  "$python" -m threewalls.bench.pytorch_kernels --out "$out/framework/pytorch_kernels" --profile "$profile" \
    --device cpu --iters 1 --repeats 2 --max-points 6 > "$out/logs/pytorch_kernels.log" 2>&1
else
  "$python" -m threewalls.bench.pytorch_kernels --out "$out/framework/pytorch_kernels" --profile "$profile" \
    > "$out/logs/pytorch_kernels.log" 2>&1
fi || { echo "threewalls.bench.pytorch_kernels failed (logs/pytorch_kernels.log)" >&2; cat "$out/logs/pytorch_kernels.log" >&2; }
refit=${REFIT:-}
if [ -z "$refit" ] && [ -n "$merge" ]; then
  for m in "$(dirname "$merge")/bench/threewalls_refit_raw" "$(dirname "$merge")/threewalls_refit_raw"; do
    [ -x "$m" ] && { refit=$m; break; }
  done
fi
if [ -n "$pytorch_profile" ] && [ -n "$refit" ] && [ -s "$out/framework/pytorch_kernels/points.jsonl" ]; then
  kernels_toml=$out/framework/pytorch_kernels/pytorch_kernels.toml
  families=$(grep -o '"family": "pytorch[a-z_]*\.[a-z_]*"' "$out/framework/pytorch_kernels/points.jsonl" | cut -d'"' -f4 | sort -u)
  # shellcheck disable=SC2086 # one argument per family
  { "$refit" "$out/framework/pytorch_kernels" "$kernels_toml" &&
    "$merge" "$pytorch_profile" "$kernels_toml" "$pytorch_profile" $families; } >> "$out/logs/merge_families.log" 2>&1 ||
    { echo "refitting the pytorch.* families failed (logs/merge_families.log)" >&2; cat "$out/logs/merge_families.log" >&2; }
fi

# 3. and 4. The reference runner (and the simulator when THREEWALLS is given).
if [ "$smoke" = 1 ]; then
  scenarios=("$repo/python/tests/scenarios/tiny_moe.toml" "$repo/python/tests/scenarios/tiny_mla_infer.toml")
  runner_args=(--device cpu)
else
  scenarios=("$repo/scenarios/examples/small_moe_1gpu.toml" "$repo"/python/scenarios/*.toml)
  runner_args=()
fi
status=()
run_one() {  # NAME SCENARIO NPROC [RUNNER_ARG ...]
  local name=$1 sc=$2 n=$3 rc=0
  shift 3
  local extra=("$@")
  local t0
  t0=$(date +%s)
  if [ "$n" -gt 1 ]; then
    "$python" -m torch.distributed.run --standalone --nproc_per_node="$n" -m threewalls.runner "$sc" \
      --out "$out/runs/$name" "${runner_args[@]}" "${extra[@]}" > "$out/logs/$name.log" 2>&1 || rc=$?
  else
    "$python" -m threewalls.runner "$sc" --out "$out/runs/$name" "${runner_args[@]}" "${extra[@]}" \
      > "$out/logs/$name.log" 2>&1 || rc=$?
  fi
  local note="run rc=$rc $(($(date +%s) - t0)) s"
  if [ "$rc" -ne 0 ]; then
    tail -20 "$out/logs/$name.log" >&2
  elif [ -n "${THREEWALLS:-}" ]; then
    mkdir -p "$out/sim" "$out/compare"
    if "$THREEWALLS" sim "$sc" --out "$out/sim/$name" > "$out/logs/$name.sim.log" 2>&1 &&
       "$THREEWALLS" compare "$out/runs/$name" "$out/sim/$name" --json "$out/compare/$name.json" \
         > "$out/compare/$name.txt" 2>&1; then
      note="$note; compare: $(grep -m1 '^step time' "$out/compare/$name.txt" | sed 's/  */ /g')"
    else
      note="$note; sim/compare failed (logs/$name.sim.log, compare/$name.txt)"
    fi
  fi
  if [ "$rc" -eq 0 ] && [ -n "${THREEWALLS:-}" ] && [ -n "$pytorch_profile" ] &&
     grep -Eq '^[[:space:]]*framework[[:space:]]*=[[:space:]]*"pytorch_eager"' "$sc"; then
    mkdir -p "$out/sim_pytorch" "$out/compare_pytorch"
    if "$THREEWALLS" sim "$sc" --calibration "$pytorch_profile" --out "$out/sim_pytorch/$name" \
         > "$out/logs/$name.sim_pytorch.log" 2>&1 &&
       "$THREEWALLS" compare "$out/runs/$name" "$out/sim_pytorch/$name" --json "$out/compare_pytorch/$name.json" \
         > "$out/compare_pytorch/$name.txt" 2>&1; then
      note="$note; with the measured host.framework_op: $(grep -m1 '^step time' "$out/compare_pytorch/$name.txt" | sed 's/  */ /g')"
    else
      note="$note; sim/compare with profile_pytorch.toml failed (logs/$name.sim_pytorch.log)"
    fi
  fi
  status+=("$name: $note")
  echo "$name: $note"
}
for sc in "${scenarios[@]}"; do
  run_one "$(basename "$sc" .toml)" "$sc" 1
done
if [ "$ngpu" -ge 2 ]; then
  run_one small_moe_ep2 "$repo/scenarios/examples/small_moe_ep2.toml" 2
  # Expert and data parallelism on two GPUs (docs/validation/python_runner_ep2_h200x2_2026-11-29.md), each
  # step's host clock in OUT/runs/walls_<name>.json (recorded and unrecorded steps, as scripts/pytorch_heldout.py reads them).
  for sc in "$repo"/python/scenarios/ep2/*.toml; do
    ep2name=$(basename "$sc" .toml)
    run_one "$ep2name" "$sc" 2 --wall-json "$out/runs/walls_$ep2name.json"
  done
fi

# 7. A Hugging Face model as the source (transformers' own model class, random weights).
if [ "$smoke" = 0 ] && "$python" -c "import transformers" > /dev/null 2>&1; then
  run_one olmoe_4l_hf "$repo/python/scenarios/hf/olmoe_4l_hf.toml" 1 \
    --hf-config "$repo/tests/scenarios/fixtures/import_corpus/hf/olmoe_1b_7b.json"
else
  echo "olmoe_4l_hf: skipped (--cpu-smoke, or transformers is not installed)"
fi

# 6. A PyTorch profiler trace of one runner scenario, imported as a run directory.
if [ "$smoke" = 1 ]; then
  ksc="$repo/python/tests/scenarios/tiny_moe.toml"
  kargs=(--device cpu --steps 2 --warmup-steps 1)
else
  ksc="$repo/python/scenarios/deepseek_v2_lite_4l.toml"
  kargs=(--steps 2 --warmup-steps 1)
fi
kname=$(basename "$ksc" .toml)
mkdir -p "$out/kineto"
krc=0
"$python" -m threewalls.runner "$ksc" --out "$out/kineto/${kname}_runner" --record-every 1 --torch-profile \
  "$out/kineto/$kname.json" "${kargs[@]}" > "$out/logs/kineto_$kname.log" 2>&1 &&
"$python" -m threewalls.importers kineto "$out/kineto/$kname.json" --scenario "$ksc" --out "$out/kineto/${kname}_run" \
  >> "$out/logs/kineto_$kname.log" 2>&1 || krc=$?
knote="kineto $kname: rc=$krc"
if [ "$krc" -eq 0 ] && [ -n "${THREEWALLS:-}" ]; then
  "$THREEWALLS" compare "$out/kineto/${kname}_runner" "$out/kineto/${kname}_run" --json "$out/kineto/runner_vs_import.json" \
    > "$out/kineto/runner_vs_import.txt" 2>&1 || knote="$knote; compare with the runner's records failed"
  "$THREEWALLS" sim "$ksc" ${pytorch_profile:+--calibration "$pytorch_profile"} --out "$out/kineto/${kname}_sim" \
    > "$out/logs/kineto_sim.log" 2>&1 &&
  "$THREEWALLS" compare "$out/kineto/${kname}_run" "$out/kineto/${kname}_sim" --json "$out/kineto/import_vs_sim.json" \
    > "$out/kineto/import_vs_sim.txt" 2>&1 || knote="$knote; sim/compare of the import failed"
fi
[ "$krc" -ne 0 ] && tail -20 "$out/logs/kineto_$kname.log" >&2
[ -f "$out/kineto/$kname.json" ] && gzip -9 "$out/kineto/$kname.json"  # the importer reads TRACE.json.gz too
echo "$knote"
status+=("$knote")

"$python" - "$out" "$(($(date +%s) - t_start))" "${status[@]}" <<'EOF'
import glob, json, os, sys
out, seconds, status = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
res = {"seconds": seconds, "runs": status, "overhead": {}}
fw = os.path.join(out, "framework", "framework.json")
if os.path.exists(fw):
    res["framework"] = json.load(open(fw))
for f in sorted(glob.glob(os.path.join(out, "overhead", "overhead_*.json"))):
    j = json.load(open(f))
    res["overhead"][os.path.basename(f)[9:-5]] = {"device": j["device"], "overhead_pct": j["overhead_pct"],
                                                  "within_target": j["within_target"],
                                                  "median_step_time_s": j["median_step_time_s"]}
json.dump(res, open(os.path.join(out, "checks.json"), "w"), indent=2)
print(f"python_gpu_checks: {seconds} s")
for k, v in res["overhead"].items():
    print(f"  overhead ({k}): " + ", ".join(f"{m} {p:+.3f}%" for m, p in v["overhead_pct"].items()) +
          f" (within target: {v['within_target']})")
if "framework" in res:
    figs = res["framework"]["figures"]
    print("  framework: " + ", ".join(f"{k} {v['median_us'] if isinstance(v, dict) else v}" for k, v in figs.items()
                                      if v is not None))
failed = [s for s in status if "rc=0" not in s]
print(f"  runner: {len(status) - len(failed)} of {len(status)} runs finished")
sys.exit(1 if failed else 0)
EOF
