#!/usr/bin/env bash
# check_record_keys.sh SIM_DIR REAL_DIR
#
# Checks that a real run and a simulated run of the same scenario recorded the same phase records
# (docs/formats/run_dir.md): the key (step, rank, phase, layer, microbatch, expert) of every phase
# line of phases_rank_*.jsonl, and the field names each record carries (optional fields such as
# peer, group, tokens, coarse must be present on both sides or on neither; launch_wait_us, written
# where the measured wait is non-zero, is left out of that comparison). Prints every key present
# on one side only and every key whose field names differ, then a one-line verdict.
# Exit 0: identical; 1: differences; 2: bad arguments or unreadable run directories.
# (`threewalls compare A B` also lists one-sided keys, with timing errors; this script needs no build.)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 SIM_DIR REAL_DIR" >&2
  exit 2
fi
exec python3 - "$1" "$2" <<'PY'
import glob, json, os, sys

# Optional fields written where their measured value is non-zero (docs/formats/run_dir.md): which
# records carry them depends on timing, not on the schema, so the field-name comparison leaves them out.
MEASURED_OPTIONAL = frozenset({"launch_wait_us"})

def load(d):
    if not os.path.isdir(d):
        print(f"{d}: not a directory", file=sys.stderr); sys.exit(2)
    files = sorted(glob.glob(os.path.join(d, "phases_rank_*.jsonl")))
    if not files:
        print(f"{d}: no phases_rank_*.jsonl (is it a run directory with recording ranks?)", file=sys.stderr); sys.exit(2)
    keys, source = {}, None
    for f in files:
        with open(f) as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"{f}:{n}: not JSON: {e}", file=sys.stderr); sys.exit(2)
                kind = r.get("record")
                if kind == "header":
                    source = r.get("source")
                    continue
                if kind is not None:  # step and footer records
                    continue
                k = (r["step"], r["rank"], r["phase"], r.get("layer"), r.get("microbatch"), r.get("expert"))
                if k in keys:
                    print(f"{f}:{n}: duplicate key {k}", file=sys.stderr)
                keys[k] = frozenset(r.keys()) - MEASURED_OPTIONAL
    return keys, source, len(files)

sim_dir, real_dir = sys.argv[1], sys.argv[2]
a, sa, fa = load(sim_dir)
b, sb, fb = load(real_dir)
def show(k):
    step, rank, phase, layer, mb, expert = k
    s = f"step {step} rank {rank} {phase}"
    if layer is not None: s += f" layer {layer}"
    if mb is not None: s += f" microbatch {mb}"
    if expert is not None: s += f" expert {expert}"
    return s
only_a = sorted(set(a) - set(b), key=str)
only_b = sorted(set(b) - set(a), key=str)
diff_fields = sorted((k for k in set(a) & set(b) if a[k] != b[k]), key=str)
for k in only_a:
    print(f"only in {sim_dir} ({sa}): {show(k)}")
for k in only_b:
    print(f"only in {real_dir} ({sb}): {show(k)}")
for k in diff_fields:
    print(f"fields differ: {show(k)}: {sim_dir} has {sorted(a[k] - b[k])} extra, {real_dir} has {sorted(b[k] - a[k])} extra")
total = len(set(a) | set(b))
if only_a or only_b or diff_fields:
    print(f"record keys DIFFER: {len(only_a)} only in {sim_dir}, {len(only_b)} only in {real_dir}, "
          f"{len(diff_fields)} with different fields, of {total} keys ({fa} and {fb} phases files)")
    sys.exit(1)
print(f"record keys identical: {total} keys, same fields ({sa}: {fa} phases files, {sb}: {fb} phases files)")
PY
