#!/usr/bin/env python3
"""Peak memory: the memory model against real runs on one GPU, and the OOM verdict on both sides of the
boundary (docs/memory_model.md, "Allocated, reserved, device-wide"; docs/backend.md, "Memory").

For every scenario (default: the one-GPU scenarios of the fidelity suite and of
scenarios/validation/memory/, which holds pairs of scenarios sized just under and just over an H100's
and an H200's memory; only the pair of this machine's GPU kind runs): simulate it (`threewalls sim --fidelity analytic --no-run-dir`'s summary is not enough, so a run
directory is written), run it for real (`threewalls run`), and print one table:

    scenario | model verdict | modelled peak | modelled activations | measured allocated | measured
    reserved | device-wide peak | error % (device-wide vs modelled peak) | error % (allocated vs
    modelled activations) | real verdict

A real run that fails with the backend's out-of-memory error counts as "OOM" (its message must name
the rank and the bytes); any other failure is an error. The verdict is right when the model and the
real run agree.

    scripts/memory_check.py --bin BIN/threewalls --profile calibration/profiles/h100.toml --out OUT \
        [--steps 2] [scenario.toml ...]

Python 3 standard library only. Exit status 0 when every verdict agrees, 1 otherwise.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from validate_suite import world_size  # noqa: E402  (one reader of a scenario's world size)

GIB = float(1 << 30)


def gpu_kind():
    """"h100" or "h200" from nvidia-smi's name of GPU 0 (None when neither or no nvidia-smi)."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for kind in ("h100", "h200"):
        if kind in name.lower():
            return kind
    return None


def cluster_gpu(path):
    with open(path, "rb") as f:
        return tomllib.load(f).get("cluster", {}).get("gpu")


def run(cmd, logfile, timeout, env=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = -1, "", f"timed out after {timeout} s"
    with open(logfile, "a", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + f"\n# rc={rc} {time.time() - t0:.1f}s\n" + out + err + "\n")
    return rc, out, err


def summary(run_dir):
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def max_by_rank(mem, key):
    values = [v for v in (mem.get(key) or {}).values() if isinstance(v, (int, float))]
    return max(values) if values else None


def pct(x, ref):
    if x is None or ref is None or ref == 0:
        return "n/a"
    return f"{100.0 * (x - ref) / ref:+.1f}%"


def gib(x):
    return "n/a" if x is None else f"{x / GIB:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="threewalls (a CUDA build: run goes to threewalls-gpu beside it)")
    ap.add_argument("--profile", required=True, help="calibration profile for the simulator")
    ap.add_argument("--out", required=True, help="output folder (must not exist)")
    ap.add_argument("--steps", type=int, default=2, help="measured steps of each real run (default 2)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per real run")
    ap.add_argument("scenarios", nargs="*")
    a = ap.parse_args()
    root = os.environ.get("THREEWALLS_SOURCE_DIR", os.getcwd())
    # The OOM-boundary scenarios are sized for one GPU kind each ([cluster] gpu): by default only those
    # of this machine's kind run (on another kind the verdict would compare different capacities).
    kind = gpu_kind()
    boundary = [s for s in sorted(glob.glob(os.path.join(root, "scenarios/validation/memory/*.toml")))
                if kind is None or cluster_gpu(s) == kind]
    scenarios = a.scenarios or sorted(glob.glob(os.path.join(root, "scenarios/validation/fidelity/*.toml"))) + boundary
    scenarios = [s for s in scenarios if world_size(s) == 1]
    if os.path.exists(a.out):
        sys.exit(f"memory_check: {a.out} exists")
    os.makedirs(a.out)
    logfile = os.path.join(a.out, "commands.log")
    rows = []
    for s in scenarios:
        name = os.path.splitext(os.path.basename(s))[0]
        sim_dir = os.path.join(a.out, "sim", name)
        real_dir = os.path.join(a.out, "real", name)
        rc, out, err = run([a.bin, "sim", s, "--calibration", a.profile, "--fidelity", "analytic", "--steps", "1",
                            "--out", sim_dir], logfile, 600)
        sm = summary(sim_dir)
        if rc != 0 or sm is None:
            rows.append({"scenario": name, "error": "sim failed: " + (err or out)[-300:]})
            continue
        mem = sm["memory"]
        peak_model = max(c["peak_bytes"] for c in mem["classes"])
        act_model = max(c["breakdown_bytes"]["activations"] for c in mem["classes"])
        row = {"scenario": name, "model_oom": bool(mem["oom"]), "model_peak": peak_model, "model_activations": act_model,
               "gpu_memory": mem.get("gpu_memory_bytes")}
        t0 = time.time()
        # The scenarios here are one-GPU worlds: the run takes the machine's first GPU.
        one_gpu = dict(os.environ, NCCL_NVLS_ENABLE="0", CUDA_VISIBLE_DEVICES="0")
        rc, out, err = run([a.bin, "run", s, "--steps", str(a.steps), "--out", real_dir], logfile, a.timeout, one_gpu)
        row["real_seconds"] = round(time.time() - t0, 1)
        text = err + out
        if rc == 0:
            rm = summary(real_dir)["memory"]
            row["real_oom"] = False
            row["allocated"] = max_by_rank(rm, "peak_allocated_bytes_by_rank")
            row["reserved"] = max_by_rank(rm, "peak_reserved_bytes_by_rank")
            row["device_peak"] = max_by_rank(rm, "measured_peak_bytes_by_rank")
        elif re.search(r"out of memory", text):
            row["real_oom"] = True
            m = re.search(r"(rank \d+: [^\n]*out of memory[^\n]*)", text)
            row["oom_message"] = (m.group(1) if m else text.strip().splitlines()[-1])[:600]
            row["oom_names_rank_and_bytes"] = bool(m) and "bytes" in row["oom_message"]
        else:
            row["error"] = f"run rc={rc}: " + text[-600:]
        rows.append(row)
        print(f"{name}: done in {row['real_seconds']} s", flush=True)

    head = (f"{'scenario':36s} {'model':>6s} {'peak GiB':>9s} {'act GiB':>8s} {'alloc GiB':>9s} {'resv GiB':>9s} "
            f"{'device GiB':>10s} {'err peak':>9s} {'err act':>8s} {'real':>6s}  verdict")
    lines = [head, "-" * len(head)]
    agree = True
    for r in rows:
        if "error" in r:
            lines.append(f"{r['scenario']:36s} ERROR {r['error']}")
            agree = False
            continue
        model = "OOM" if r["model_oom"] else "fits"
        real = "OOM" if r["real_oom"] else "fits"
        ok = r["model_oom"] == r["real_oom"] and (not r["real_oom"] or r.get("oom_names_rank_and_bytes"))
        agree = agree and ok
        lines.append(f"{r['scenario']:36s} {model:>6s} {gib(r['model_peak']):>9s} {gib(r['model_activations']):>8s} "
                     f"{gib(r.get('allocated')):>9s} {gib(r.get('reserved')):>9s} {gib(r.get('device_peak')):>10s} "
                     f"{pct(r['model_peak'], r.get('device_peak')):>9s} "
                     f"{pct(r['model_activations'], r.get('allocated')):>8s} {real:>6s}  {'right' if ok else 'WRONG'}")
        if r.get("oom_message"):
            lines.append(f"    {r['oom_message']}")
    lines.append("")
    lines.append("err peak = (modelled peak - device-wide peak) / device-wide peak; "
                 "err act = (modelled activations - measured allocated) / measured allocated")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(a.out, "memory_check.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    with open(os.path.join(a.out, "memory_check.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    sys.exit(0 if agree else 1)


if __name__ == "__main__":
    main()
