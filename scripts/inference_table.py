#!/usr/bin/env python3
"""Measured vs simulated inference metrics of validate_suite.py output folders.

    scripts/inference_table.py [--variant V] OUT [OUT ...]

For every scenario with a real and a simulated run directory (OUT/real/NAME, OUT/sim/NAME), prints a
markdown row per step kind (all, prefill, decode) from each side's summary.json `inference` block:
step time mean, bubble ratio (expert wait / step time), expert wait, sync overhead share, cache hit
rate and tokens/s, with the errors (simulated - measured) / measured of step time and bubble ratio.
--variant V compares validate_suite.py's simulation variant OUT/sim_V instead of the prediction: base
(the profile alone), probe (host scaled to the run's host probe) or disk (disk reads as fast as the
run's own; neither is a prediction). Python 3 standard library only.
"""
import json
import os
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("inference") or {}


def err(sim, real):
    return "n/a" if not real else f"{100.0 * (sim - real) / real:+.1f}%"


def main():
    args = sys.argv[1:]
    sim_dir = "sim"
    if args[:1] == ["--variant"] and len(args) >= 2:
        sim_dir = "sim_" + args[1]
        args = args[2:]
    if not args:
        sys.exit(__doc__)
    print("| scenario | steps | step time real / sim (ms) | error | bubble ratio real / sim | error | "
          "expert wait real / sim (ms) | sync share real / sim | hit rate | tokens/s real / sim |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for out in args:
        real_root = os.path.join(out, "real")
        for name in sorted(os.listdir(real_root)):
            r_path = os.path.join(real_root, name, "summary.json")
            s_path = os.path.join(out, sim_dir, name, "summary.json")
            if not (os.path.exists(r_path) and os.path.exists(s_path)):
                print(f"| {name} | missing {'sim' if os.path.exists(r_path) else 'real'} run | | | | | | | | |")
                continue
            r, s = load(r_path), load(s_path)
            for kind in ("all", "prefill", "decode"):
                if kind not in r or kind not in s:
                    continue
                a, b = r[kind], s[kind]
                print(f"| {name} | {kind} ({a['steps']}) | {a['step_time_us_mean'] / 1e3:.1f} / "
                      f"{b['step_time_us_mean'] / 1e3:.1f} | {err(b['step_time_us_mean'], a['step_time_us_mean'])} | "
                      f"{a['bubble_ratio']:.4f} / {b['bubble_ratio']:.4f} | {err(b['bubble_ratio'], a['bubble_ratio'])} | "
                      f"{a['expert_wait_us_mean'] / 1e3:.2f} / {b['expert_wait_us_mean'] / 1e3:.2f} | "
                      f"{a['sync_overhead_share']:.3f} / {b['sync_overhead_share']:.3f} | "
                      f"{a['cache_hit_rate']:.3f} / {b['cache_hit_rate']:.3f} | "
                      f"{a['tokens_per_s']:.1f} / {b['tokens_per_s']:.1f} |")


if __name__ == "__main__":
    main()
