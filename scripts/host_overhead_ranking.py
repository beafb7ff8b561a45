#!/usr/bin/env python3
"""Strategy ranking of the host-overhead suite: for every (d_model, tokens, graph scope)
group of scenarios switch_d{D}_t{T}_{strategy}_{scope}, the order of the strategies by measured and by
simulated step time, from validate_suite.py's results.json.

    scripts/host_overhead_ranking.py OUT/results.json [--host-probe]

--host-probe orders the simulated side by the simulation with each run's host costs scaled to its own
host probe (validate_suite.py's sim_step_ms_host_probe) instead of the prediction.
"""
import json
import re
import sys
from collections import defaultdict


def main():
    results = json.load(open(sys.argv[1]))
    sim_key = "sim_step_ms_host_probe" if "--host-probe" in sys.argv[2:] else "sim_step_ms"
    groups = defaultdict(dict)
    for name, r in results.items():
        m = re.fullmatch(r"switch_d(\d+)_t(\w+?)_(grouped|sequential|streams\d+)_(\w+)", name)
        if not m or r.get("real_step_ms") is None or r.get(sim_key) is None:
            continue
        groups[(int(m.group(1)), m.group(2), m.group(4))][m.group(3)] = (r["real_step_ms"], r[sim_key])
    agree = 0
    print("| d_model | tokens | graphs | measured order (ms) | simulated order (ms) | same |")
    print("|---|---|---|---|---|---|")
    for key in sorted(groups):
        g = groups[key]
        if len(g) < 2:
            continue
        real = sorted(g, key=lambda k: g[k][0])
        sim = sorted(g, key=lambda k: g[k][1])
        same = real == sim
        agree += same
        fmt = lambda order, i: " < ".join(f"{k} {g[k][i]:.2f}" for k in order)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {fmt(real, 0)} | {fmt(sim, 1)} | {'yes' if same else 'no'} |")
    n = sum(len(g) >= 2 for g in groups.values())
    print(f"\nsame order in {agree} of {n} groups")


if __name__ == "__main__":
    main()
