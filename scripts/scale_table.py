#!/usr/bin/env python3
"""Published vs simulated throughput of the at-scale Megatron-Core rows (scenarios/validation/scale/).

    scripts/scale_table.py THREEWALLS_BINARY [--fidelity flow|analytic] [--only NAME] [--keep DIR]

Simulates every scenario named in scenarios/validation/scale/published.json with the shipped profiles
and prints one markdown row per scenario: the published model TFLOP/s per GPU, the simulated one (the
summary's tflops_per_gpu: Megatron's num_floating_point_operations over the simulated step time), the
error (simulated - published) / published, the same for tokens/s per GPU where the publication gives
it (no FLOP formula enters it; a row whose publication counted FLOPs otherwise says so), the step time and the walls of the critical path as shares
of the step, then the five phases with the most time summed over the rank classes (pipeline receives, which
are waits, left out). Run from the
repository root. Python 3 standard library only.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join("scenarios", "validation", "scale")


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    binary = os.path.abspath(args[0])
    fidelity, only, keep = "flow", None, None
    i = 1
    while i < len(args):
        if args[i] == "--fidelity" and i + 1 < len(args):
            fidelity = args[i + 1]
        elif args[i] == "--only" and i + 1 < len(args):
            only = args[i + 1]
        elif args[i] == "--keep" and i + 1 < len(args):
            keep = os.path.abspath(args[i + 1])
        else:
            sys.exit(f"scale_table.py: unknown argument '{args[i]}'\n{__doc__}")
        i += 2
    with open(os.path.join(ROOT, FOLDER, "published.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    out_root = keep or tempfile.mkdtemp(prefix="scale_table_")
    print(f"fidelity {fidelity}; run directories under {out_root}\n")
    print("| model | GPUs | layout | published TFLOP/s/GPU | simulated | error | published tokens/s/GPU | simulated | error "
          "| step s | compute | memory | comm (exposed) | bubble |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    tops = []
    for row in rows:
        name = row["scenario"]
        if only and name != only:
            continue
        out = os.path.join(out_root, name)
        cmd = [binary, "sim", os.path.join(FOLDER, name + ".toml"), "--out", out, "--overwrite", "--fidelity", fidelity]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"| {row['model']} | {row['gpus']} | {row['layout']} | {row['published_tflops_per_gpu']} | failed: {done.stderr.strip().splitlines()[-1:]} |")
            continue
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
            s = json.load(f)
        step = s["steps"][0]
        pub = float(row["published_tflops_per_gpu"])
        sim = step["tflops_per_gpu"]
        t = step["step_time_us"]
        w = step["walls_us"]
        share = lambda k: f"{100.0 * w[k] / t:.0f}%"
        tokens = step["tokens_per_s"] / row["gpus"]
        pub_tokens = row.get("published_tokens_per_s_per_gpu")
        tok_cols = (f"{pub_tokens:.0f} | {tokens:.0f} | {100.0 * (tokens - pub_tokens) / pub_tokens:+.1f}%" if pub_tokens
                    else f"– | {tokens:.0f} | –")
        flops_note = " (other formula)" if row.get("formula_note") else ""
        print(f"| {row['model']} | {row['gpus']} | {row['layout']} | {pub:.0f} | {sim:.0f} | "
              f"{100.0 * (sim - pub) / pub:+.1f}%{flops_note} | {tok_cols} | "
              f"{t / 1e6:.1f} | {share('compute')} | {share('memory')} | {share('communication')} | {share('bubble')} |")
        # Pipeline receives are waits for the neighbour stage, not work: left out.
        work = [p for p in s.get("phases", []) if not p["phase"].startswith("pp_recv")]
        top = sorted(work, key=lambda p: -p["total_us"])[:5]
        tops.append((row["model"], top))
    print()
    for model, top in tops:
        print(f"{model}: phases with the most time (summed over rank classes): " +
              ", ".join(f"{p['phase']} {p['total_us'] / 1e6:.1f} s" for p in top))


if __name__ == "__main__":
    main()
