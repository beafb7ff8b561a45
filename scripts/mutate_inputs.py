#!/usr/bin/env python3
"""Random mutation campaign over the input surfaces past the scenario loader.

Surfaces (each read by tests/fuzz/scenario_sim_runner --surface S in a forked child under a wall-clock
and an address-space limit):

  rundir      run directories written by `threewalls sim` (two small examples as seeds): a file of
              one mutated, truncated, deleted, or replaced by the same file of the other run
  profile     calibration profiles (calibration/profiles/*.toml)
  megatron    Megatron launch scripts (scenarios/inputs/*.sh), plus deep $(( )) nesting and many
              variable lines
  hf          Hugging Face config.json files (scenarios/inputs/*.json), plus deep nesting
  plan-merge  the plan.json shards of a `threewalls plan --shard i/2` sweep (seeds made here): one
              shard mutated, dropped, duplicated or taken from another sweep

A mutant is 1 to 3 edits: a number replaced by an edge value (0, -1, 2^31, 1e308, 1e-320, NaN...), a
string by an edge string, a line deleted, duplicated or swapped, a JSON value replaced by null, [], {}
or another type, a key renamed, the file cut at a random byte, a long line inserted. Findings (as
scripts/mutate_scenarios.py): crash, hang, memory, nan; and mutator-error, an exception of this
script while making a mutant (counted with its message, the campaign goes on). `rejected` (a located InputError) and `ok` are
the expected outcomes.

Usage: scripts/mutate_inputs.py BUILD_DIR --surface S [--count N] [--seed S] [--minutes M]
       [--timeout S] [--mem-mb M] [--keep DIR] [--report FILE] [--seeds DIR] [--quiet]
       scripts/mutate_inputs.py BUILD_DIR --make-seeds DIR
Exit status 1 when there is any finding; each finding's mutant is kept under --keep (default
BUILD_DIR/mutations-<surface>) with its edits in edits.txt. --report writes the counts by outcome,
the slowest mutants and every finding as JSON (scripts/robustness_campaign.sh joins the reports).
The rundir and plan-merge seeds are made with BUILD_DIR/cli/threewalls, which finds the calibration
profiles in the source tree it was built from; on another machine, make them where it was built
(--make-seeds DIR writes DIR/rundir and DIR/plan-merge) and pass --seeds DIR there.
docs/fuzzing.md records the campaigns run.
"""
import argparse
import glob
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

from mutate_scenarios import runner_verdicts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SURFACES = ("rundir", "profile", "megatron", "hf", "plan-merge")
SEEDED_SURFACES = ("rundir", "plan-merge")  # seeds made with the threewalls binary

NUM_EDGES = ["0", "1", "-1", "2", "32767", "32768", "65536", "2147483647", "2147483648", "4294967296",
             "9223372036854775807", "18446744073709551616", "-2147483648", "1e308", "1e309", "-1e308", "1e-320",
             "4e-320", "1e-300", "0.0", "-0.0", "0.5", "nan", "inf", "-inf", "1e300", "3.5", "00", "1_000", "0x10"]
STR_EDGES = ['""', '"x"', '"nan"', '"inf"', '"1e300s"', '"4e-320Bps"', '"-1us"', '"0Bps"', '"../../x"', '"h100"',
             '"h200"', '"a"' * 1, '"' + "y" * 5000 + '"', '"\\u0000"', '"1.1"', '"2.0"', '"0"']
JSON_EDGES = ["null", "[]", "{}", "true", "false", '"s"', "0", "-1", "1e308", "[1,2]", '{"a":1}']
NUM_RE = re.compile(r"(?<![A-Za-z_\d.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![A-Za-z_\d])")
STR_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def negated(number_text):
    """The negative of a number's integer part ("-1" for 0, and for a value too large for an int)."""
    v = float(number_text)
    if not math.isfinite(v) or abs(v) >= 2.0**63:
        return "-1"
    return str(-abs(int(v) or 1))


def edit_text(text, rng, is_json):
    """One random edit of `text`; returns (text, description)."""
    kind = rng.random()
    lines = text.split("\n")
    if kind < 0.35:
        nums = list(NUM_RE.finditer(text))
        if nums:
            m = rng.choice(nums)
            new = rng.choice(NUM_EDGES + [m.group(0) + "0", negated(m.group(0))])
            return text[:m.start()] + new + text[m.end():], "number %s -> %s at %d" % (m.group(0), new, m.start())
    if kind < 0.5:
        strs = list(STR_RE.finditer(text))
        if strs:
            m = rng.choice(strs)
            new = rng.choice(JSON_EDGES if is_json else STR_EDGES) if is_json and rng.random() < 0.5 else rng.choice(STR_EDGES)
            return text[:m.start()] + new + text[m.end():], "string %s -> %s" % (m.group(0)[:40], new[:40])
    if kind < 0.6 and len(lines) > 1:
        i = rng.randrange(len(lines))
        d = lines.pop(i)
        return "\n".join(lines), "delete line %d (%s)" % (i + 1, d[:60])
    if kind < 0.68 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return "\n".join(lines), "duplicate line %d" % (i + 1)
    if kind < 0.74 and len(lines) > 2:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines), "swap lines %d and %d" % (i + 1, j + 1)
    if kind < 0.82 and text:
        cut = rng.randrange(len(text))
        return text[:cut], "cut at byte %d" % cut
    if kind < 0.88:
        keys = list(re.finditer(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:' if is_json else r"^([A-Za-z_][A-Za-z0-9_.]*)\s*=", text, re.M))
        if keys:
            m = rng.choice(keys)
            return text[:m.start(1)] + m.group(1) + "x" + text[m.end(1):], "rename key %s" % m.group(1)
    if kind < 0.94:
        i = rng.randrange(len(lines) + 1)
        junk = rng.choice(["\x00\xff", "{" * 2000, "[" * 2000, "x" * 100000, "\\", '"', "= =", "--", "\t\r"])
        lines.insert(i, junk)
        return "\n".join(lines), "insert %r... at line %d" % (junk[:8], i + 1)
    return text + "\n" + rng.choice(lines or [""]), "append a copy of a line"


def mutate_file(path, rng, edits_out):
    with open(path, "r", encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    is_json = path.endswith(".json") or path.endswith(".jsonl")
    for _ in range(rng.randint(1, 3)):
        text, what = edit_text(text, rng, is_json)
        edits_out.append("%s: %s" % (os.path.basename(path), what))
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, **kw)


def make_seeds(surface, build, work, premade=None):
    """Seed inputs: file paths (profile, megatron, hf) or directories (rundir, plan-merge); those two
    are taken from premade/<surface>/ when given (--seeds)."""
    cli = os.path.join(build, "cli", "threewalls")
    if premade and surface in SEEDED_SURFACES:
        found = sorted(glob.glob(os.path.join(premade, surface, "seed_*")))
        if not found:
            sys.exit("mutate_inputs: no seeds %s/%s/seed_* (make them with --make-seeds %s)" % (premade, surface, premade))
        return found
    if surface == "profile":
        return sorted(glob.glob(os.path.join(ROOT, "calibration/profiles/*.toml")))
    if surface == "megatron":
        seeds = sorted(glob.glob(os.path.join(ROOT, "scenarios/inputs/*.sh")))
        deep = os.path.join(work, "seed_deep.sh")
        with open(deep, "w") as f:
            f.write("L=$((" + "(" * 20000 + "1" + ")" * 20000 + "))\ntorchrun pretrain_gpt.py --num-layers $L\n")
        many = os.path.join(work, "seed_vars.sh")
        with open(many, "w") as f:
            f.write("".join("V%d=${V%d:-%d}\n" % (i, max(i - 1, 0), i) for i in range(20000)))
            f.write("torchrun pretrain_gpt.py --num-layers $V19999 --hidden-size 1024\n")
        return seeds + [deep, many]
    if surface == "hf":
        seeds = sorted(glob.glob(os.path.join(ROOT, "scenarios/inputs/*.json")))
        deep = os.path.join(work, "seed_deep.json")
        with open(deep, "w") as f:
            f.write('{"architectures": ["MixtralForCausalLM"], "x": ' + "[" * 20000 + "]" * 20000 + "}")
        return seeds + [deep]
    if surface == "rundir":
        out = []
        for ex in ("small_moe_ep2", "small_moe_tp2_ep2"):
            d = os.path.join(work, "seed_" + ex)
            p = run([cli, "sim", "scenarios/examples/%s.toml" % ex, "--steps", "2", "--out", d])
            if p.returncode != 0:
                sys.exit("mutate_inputs: could not make the seed run %s: %s" % (ex, p.stderr.decode()[-400:]))
            out.append(d)
        return out
    if surface == "plan-merge":
        out = []
        for ex in ("small_moe_ep4", "small_moe_tp2_ep2"):
            d = os.path.join(work, "seed_" + ex)
            os.makedirs(d)
            for i in (0, 1):
                p = run([cli, "plan", "scenarios/examples/%s.toml" % ex, "--gpus", "8", "--shard", "%d/2" % i, "--top", "4",
                         "--format", "json"])
                if p.returncode != 0:
                    sys.exit("mutate_inputs: could not make the seed plan %s: %s" % (ex, p.stderr.decode()[-400:]))
                with open(os.path.join(d, "shard%d.json" % i), "wb") as f:
                    f.write(p.stdout)
            out.append(d)
        return out
    raise SystemExit("unknown surface " + surface)


def make_mutant(surface, seeds, rng, path):
    """Writes one mutant at `path` (a file, or a directory for rundir and plan-merge); returns its edits."""
    seed = rng.choice(seeds)
    edits = ["seed " + os.path.basename(seed)]
    if os.path.isdir(seed):
        shutil.copytree(seed, path)
        files = sorted(f for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))
        other = rng.choice([s for s in seeds if s != seed] or [seed])
        kind = rng.random()
        name = rng.choice(files)
        if kind < 0.7:
            mutate_file(os.path.join(path, name), rng, edits)
        elif kind < 0.8:
            os.remove(os.path.join(path, name))
            edits.append("delete " + name)
        elif kind < 0.9 and os.path.exists(os.path.join(other, name)):
            shutil.copy(os.path.join(other, name), os.path.join(path, name))
            edits.append("%s from %s" % (name, os.path.basename(other)))
        else:
            shutil.copy(os.path.join(path, name), os.path.join(path, "copy_" + name))
            edits.append("duplicate " + name)
    else:
        shutil.copy(seed, path)
        mutate_file(path, rng, edits)
    return edits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--surface", choices=SURFACES)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261127)
    ap.add_argument("--minutes", type=float, default=0, help="stop after this long (0: no limit)")
    ap.add_argument("--keep", default=None)
    ap.add_argument("--timeout", type=int, default=20, help="seconds per mutant")
    ap.add_argument("--mem-mb", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--report", default=None, help="JSON report: counts, slowest mutants, findings")
    ap.add_argument("--seeds", default=None, help="premade rundir and plan-merge seeds (--make-seeds)")
    ap.add_argument("--make-seeds", default=None, metavar="DIR", help="write the rundir and plan-merge seeds and exit")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    if a.make_seeds:
        for surface in SEEDED_SURFACES:
            dest = os.path.join(a.make_seeds, surface)
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            made_seeds = make_seeds(surface, build, dest)
            print("mutate_inputs: %d %s seeds in %s" % (len(made_seeds), surface, dest))
        return 0
    if not a.surface:
        ap.error("--surface is required (or --make-seeds DIR)")
    runner = os.path.join(build, "tests", "fuzz", "scenario_sim_runner")
    keep = a.keep or os.path.join(build, "mutations-" + a.surface)
    os.makedirs(keep, exist_ok=True)
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="threewalls_inputs_")
    counts, made, slowest, found = {}, 0, [], []
    start = time.time()
    try:
        seeds = make_seeds(a.surface, build, work, a.seeds)
        ext = {"profile": ".toml", "megatron": ".sh", "hf": ".json"}.get(a.surface, "")
        while made < a.count and not (a.minutes and time.time() - start > a.minutes * 60):
            batch = {}
            for _ in range(min(a.batch, a.count - made)):
                path = os.path.join(work, "m%05d%s" % (made, ext))
                made += 1
                try:
                    batch[path] = make_mutant(a.surface, seeds, rng, path)
                except Exception as e:  # a bug of this script: counted and kept, the campaign goes on
                    counts["mutator-error"] = counts.get("mutator-error", 0) + 1
                    found.append({"verdict": "mutator-error", "kept": "", "edits": ["%s: %s" % (type(e).__name__, e)],
                                  "detail": []})
                    if os.path.isdir(path):
                        shutil.rmtree(path, ignore_errors=True)
                    elif os.path.exists(path):
                        os.remove(path)
            if not batch:
                continue
            p = subprocess.run([runner, "--surface", a.surface, "--timeout", str(a.timeout), "--mem-mb",
                                str(a.mem_mb)] + list(batch), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT, preexec_fn=lambda: os.nice(19))
            errs = p.stderr.decode("utf-8", "replace")
            for path, verdict, took in runner_verdicts(p, batch, counts):
                if took is not None:
                    slowest = sorted(slowest + [(took, "; ".join(batch[path]))], reverse=True)[:5]
                if verdict in ("ok", "rejected"):
                    continue
                dest = os.path.join(keep, "%s_%s" % (verdict, os.path.basename(path)))
                shutil.rmtree(dest, ignore_errors=True)
                (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, dest)
                detail = [l[len(path):][:300] for l in errs.splitlines() if l.startswith(path)][:3]
                with open(dest + ".edits.txt", "w") as f:
                    f.write("\n".join(batch[path]) + "\n")
                    f.write("\n".join(detail) + "\n")
                found.append({"verdict": verdict, "kept": dest, "edits": batch[path], "detail": detail})
                if not a.quiet:
                    print("%s: %s (%s)" % (verdict, dest, "; ".join(batch[path])[:300]), flush=True)
            for path in batch:
                (shutil.rmtree if os.path.isdir(path) else os.remove)(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    minutes = (time.time() - start) / 60
    findings = {k: v for k, v in counts.items() if k not in ("ok", "rejected")}
    print("%s mutants %d in %.1f min: rejected %d, accepted %d; findings: %s" %
          (a.surface, made, minutes, counts.get("rejected", 0), counts.get("ok", 0),
           ", ".join("%s %d" % kv for kv in sorted(findings.items())) or "none"), flush=True)
    for t, what in slowest[:3]:
        print("  slowest %.2f s: %s" % (t, what[:200]), flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"surface": a.surface, "mutants": made, "minutes": minutes, "seed": a.seed, "counts": counts,
                       "slowest": [{"seconds": t, "edits": e} for t, e in slowest], "findings": found}, f, indent=1)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
