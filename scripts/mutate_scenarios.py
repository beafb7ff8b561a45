#!/usr/bin/env python3
"""Random mutation campaign over the shipped and validation scenarios.

Each mutant (1 to 3 random edits of one seed scenario: a value replaced by an edge value, a key
deleted or duplicated, a table's key added or replaced) goes through the scenario loader (what
`threewalls validate` checks) and, when accepted, through expansion and simulation (what `threewalls
graph` and `threewalls sim` do, 2 steps, a run directory written), each in a forked child of
scenario_sim_runner (tests/fuzz/) under a wall-clock and an address-space limit. Findings:

  crash         a signal, or an exception other than an input error
  hang          past the time limit
  memory        past the memory limit
  nan           a NaN or infinity in the summary, or a null duration in the run directory
  sim-rejected  the loader accepted the scenario but the simulation refused it
  mutator-error an exception of this script while making a mutant (counted, the campaign goes on)

Usage: scripts/mutate_scenarios.py RUNNER [--count N] [--seed S] [--minutes M] [--small] [--keep DIR]
       [--report FILE]
RUNNER is build/tests/fuzz/scenario_sim_runner. --report writes the counts by outcome, the 20 slowest
mutants and every finding as JSON (scripts/mutation_campaign.sh joins the reports of parallel jobs). Exit status 1 when there is any finding; each
finding's mutant is kept in --keep (default build/mutations) with its seed and edits in a comment.
docs/fuzzing.md records the campaigns run.
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INT_EDGES = [0, 1, -1, 2, 3, 7, 8, 16, 63, 64, 127, 128, 255, 256, 1000, 4096, 32767, 32768, 32770, 65535,
             65536, 100000, 1000000, 2000000, 1048576, 16777216, 2147483647, 2147483648, 4294967296,
             9223372036854775807, -2147483648]
FLOAT_EDGES = ["0.0", "1.0", "-1.0", "0.5", "1e-300", "1e300", "1e-320", "nan", "inf", "-inf", "2.0", "1000.0"]
UNIT_EDGES = ['"4e-320Bps"', '"1e-300Bps"', '"1e308PBps"', '"1e300s"', '"0s"', '"0Bps"', '"1Bps"', '"1e-9s"',
              '"1ns"', '"1PiB"', '"1B"', '"1e18Bps"', '"-1us"', '"nanBps"', '"1e15Bps"', '"100GBps"', '"1TiB"',
              '"1e300GiB"', '"1s"', '"2us"']
ARRAY_EDGES = ["[]", "[0, 0]", "[0, 1, 2, 3]", "[1]", "[100000]", "[32768]", "[-1]", '["all"]']
STRING_EDGES = ['""', '"auto"', '"all"', '"representatives"', '"streams:1"', '"streams:64"', '"sequential"', '"grouped"',
                '"fp8"', '"full"', '"selective"', '"block"', '"coarse"', '"mla"', '"gqa"', '"x" ']
EXTRA_KEYS = {
    "model": ["num_experts = 40000", "moe_router_topk = 3", "num_layers = 32770", "first_dense_layers = 1",
              "moe_layer_freq = 2", "moe_shared_expert_intermediate_size = 1024", "window_size = 1",
              "window_size = 128", "window_attn_skip_freq = 2", "window_size = 16777216"],
    "parallel": ["dp = 32768", "ep = 2", "pp = 2", "vpp = 2", "tp = 2", "cp = 2", "sequence_parallel = true",
                 "etp = 2"],
    "train": ["global_batch_size = 2147483647", "recompute_granularity = \"full\"", "expert_execution = \"sequential\"",
              "overlap_grad_reduce = true", "precision = \"fp8\"", "overlap_param_gather = true",
              "use_distributed_optimizer = true", "overlap_moe_expert_parallel_comm = true",
              "expert_execution = \"split:4\"", "expert_execution = \"split:1024\""],
    "cluster": ["pcie_bandwidth = \"4e-320Bps\"", "nvlink_latency = \"1e300s\"", "nodes = 4096",
                "nic_bandwidth = \"1e-300Bps\"", "gpus_per_node = 72"],
    "run": ["steps = 2147483647", "warmup_steps = 0", "steps = 1", "cuda_device_max_connections = 1",
            "cuda_device_max_connections = 2"],
}

LINE_RE = re.compile(r'^(\s*)([A-Za-z0-9_.]+)(\s*=\s*)(.*?)\s*$')
TABLE_RE = re.compile(r'^\s*\[\[?([A-Za-z0-9_.]+)\]\]?\s*$')


def mutate_value(v, rng):
    v = v.split(" #")[0].strip()
    if v in ("true", "false"):
        return "false" if v == "true" else "true"
    if v.startswith('"'):
        return rng.choice(UNIT_EDGES + STRING_EDGES)
    if v.startswith("["):
        return rng.choice(ARRAY_EDGES)
    try:
        n = int(v)
        return str(rng.choice(INT_EDGES + [n * 2, n * 1000, n + 1, n - 1, n * 32768]))
    except ValueError:
        pass
    return rng.choice(FLOAT_EDGES)


def mutate(text, rng):
    lines = text.split("\n")
    edits = []
    for _ in range(rng.randint(1, 3)):
        keyed = [i for i, l in enumerate(lines) if LINE_RE.match(l) and not l.lstrip().startswith("#")]
        tables = [i for i, l in enumerate(lines) if TABLE_RE.match(l)]
        kind = rng.random()
        if kind < 0.7 and keyed:
            i = rng.choice(keyed)
            m = LINE_RE.match(lines[i])
            new = mutate_value(m.group(4), rng)
            lines[i] = m.group(1) + m.group(2) + m.group(3) + new
            edits.append("%s = %s" % (m.group(2), new))
        elif kind < 0.8 and keyed:
            i = rng.choice(keyed)
            edits.append("delete " + lines[i].strip())
            del lines[i]
        elif kind < 0.85 and keyed:
            i = rng.choice(keyed)
            edits.append("duplicate " + lines[i].strip())
            lines.insert(i, lines[i])
        elif tables:
            i = rng.choice(tables)
            table = TABLE_RE.match(lines[i]).group(1).split(".")[0]
            if table in EXTRA_KEYS:
                add = rng.choice(EXTRA_KEYS[table])
                key = add.split("=")[0].strip()
                # replace the key if the table has it, else add it
                j = i + 1
                replaced = False
                while j < len(lines) and not TABLE_RE.match(lines[j]):
                    m = LINE_RE.match(lines[j])
                    if m and m.group(2) == key:
                        lines[j] = add
                        replaced = True
                        break
                    j += 1
                if not replaced:
                    lines.insert(i + 1, add)
                edits.append("[%s] %s" % (table, add))
    return "\n".join(lines), edits


def runner_verdicts(completed, batch, counts):
    """The verdicts of scenario_sim_runner's stdout (`PATH: VERDICT ... [S s]`, one line a mutant) on the
    mutants of `batch`: (path, verdict, seconds or None) each, counted by verdict in `counts`. Also
    used by scripts/mutate_inputs.py."""
    for line in completed.stdout.decode("utf-8", "replace").splitlines():
        path, _, verdict = line.partition(": ")
        if path not in batch:
            continue
        took = re.search(r"\[([\d.]+) s\]$", verdict)
        verdict = verdict.split(" ")[0]
        counts[verdict] = counts.get(verdict, 0) + 1
        yield path, verdict, float(took.group(1)) if took else None


def small(path):
    text = open(path).read()
    m = re.search(r"gpus_per_node\s*=\s*(\d+)", text)
    n = re.search(r"nodes\s*=\s*(\d+)", text)
    return m and n and int(m.group(1)) * int(n.group(1)) <= 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runner")
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=20261127)
    ap.add_argument("--minutes", type=float, default=0, help="stop after this long (0: no limit)")
    ap.add_argument("--small", action="store_true", help="only seeds of at most 8 GPUs (CI-sized)")
    ap.add_argument("--keep", default=os.path.join(ROOT, "build", "mutations"))
    ap.add_argument("--timeout", type=int, default=60, help="seconds per mutant")
    ap.add_argument("--mem-mb", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--report", default=None, help="JSON report: counts, slowest mutants, findings")
    a = ap.parse_args()
    runner = os.path.abspath(a.runner)
    seeds = sorted(glob.glob(os.path.join(ROOT, "scenarios/examples/*.toml")) +
                   glob.glob(os.path.join(ROOT, "scenarios/validation/**/*.toml"), recursive=True))
    seeds = [s for s in seeds if re.search(r"^\[(train|infer)", open(s).read(), re.M)]
    if a.small:
        seeds = [s for s in seeds if small(s)]
    rng = random.Random(a.seed)
    os.makedirs(a.keep, exist_ok=True)
    counts = {}
    slowest = []  # (seconds, seed, edits), the 20 slowest
    found = []
    start = time.time()
    work = tempfile.mkdtemp(prefix="threewalls_mutants_")
    made = 0
    try:
        while made < a.count and not (a.minutes and time.time() - start > a.minutes * 60):
            batch = {}
            for _ in range(min(a.batch, a.count - made)):
                seed = rng.choice(seeds)
                try:
                    text, edits = mutate(open(seed).read(), rng)
                except Exception as e:  # a bug of this script: counted and kept, the campaign goes on
                    made += 1
                    counts["mutator-error"] = counts.get("mutator-error", 0) + 1
                    found.append({"verdict": "mutator-error", "kept": "", "seed": os.path.relpath(seed, ROOT),
                                  "edits": ["%s: %s" % (type(e).__name__, e)], "detail": []})
                    continue
                path = os.path.join(work, "m%05d.toml" % made)
                with open(path, "w") as f:
                    f.write(text)
                batch[path] = (seed, edits, text)
                made += 1
            if not batch:
                continue
            p = subprocess.run([runner, "--timeout", str(a.timeout), "--mem-mb", str(a.mem_mb),
                                "--profile-dir", os.path.join(ROOT, "calibration", "profiles")] + list(batch),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                               preexec_fn=lambda: os.nice(19))
            errs = p.stderr.decode("utf-8", "replace")
            for path, verdict, took in runner_verdicts(p, batch, counts):
                seed, edits, text = batch[path]
                if took is not None:
                    slowest = sorted(slowest + [(took, os.path.relpath(seed, ROOT), "; ".join(edits), verdict)],
                                     reverse=True)[:20]
                if verdict in ("ok", "rejected"):
                    continue
                keep = os.path.join(a.keep, "%s_%s" % (verdict, os.path.basename(path)))
                detail = [l for l in errs.splitlines() if l.startswith(path)]
                with open(keep, "w") as f:
                    f.write("# seed: %s\n# edits: %s\n" % (os.path.relpath(seed, ROOT), "; ".join(edits)))
                    for l in detail[:3]:
                        f.write("# %s\n" % l[len(path):][:300])
                    f.write(text)
                found.append({"verdict": verdict, "kept": keep, "seed": os.path.relpath(seed, ROOT),
                              "edits": edits, "detail": [l[len(path):][:300] for l in detail[:3]]})
                if not a.quiet:
                    print("%s: %s (%s)" % (verdict, keep, "; ".join(edits)), flush=True)
            for path in batch:
                os.remove(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    minutes = (time.time() - start) / 60
    findings = {k: v for k, v in counts.items() if k not in ("ok", "rejected")}
    print("mutants %d in %.1f min: rejected by the loader %d, simulated %d; findings: %s" %
          (made, minutes, counts.get("rejected", 0), counts.get("ok", 0),
           ", ".join("%s %d" % kv for kv in sorted(findings.items())) or "none"), flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"mutants": made, "minutes": minutes, "seed": a.seed, "counts": counts,
                       "slowest": [{"seconds": t, "seed": sd, "edits": e, "verdict": v} for t, sd, e, v in slowest],
                       "findings": found}, f, indent=1)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
