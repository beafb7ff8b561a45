#!/usr/bin/env python3
"""The streams case: an eager expert loop on one stream against the same loop on N streams, measured by
the reference runner and predicted by the simulator.

    scripts/pytorch_streams.py --bin build/cli/threewalls --profile P.toml --runs DIR --out OUT

DIR holds what a GPU machine wrote for the scenarios of python/scenarios/streams/, each run one or more
times with the runs interleaved (rep 1 of every scenario, then rep 2, ...): `walls<rep>_NAME.json`
(python3 -m threewalls.runner python/scenarios/streams/NAME.toml --wall-json ...). A scenario's real
step is the median over its reps of each run's median unrecorded step (host clock); the simulated step
is `threewalls sim` of the same file with the profile. For every NAME_streamsN with a NAME_sequential
beside it, one row: the measured and simulated slow-down of N streams over one (percent), and the
difference in points (the target, docs/python.md: within 10 points). Writes OUT/streams.json.
"""
from __future__ import annotations

import glob
import json
import os
import re
import statistics
import sys

from pytorch_heldout import parser, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = os.path.join(ROOT, "python", "scenarios", "streams")


def real_steps(runs: str, name: str):
    """Per run (rep) of `name`: the median of its unrecorded steps, in ms."""
    out = []
    for p in sorted(glob.glob(os.path.join(runs, f"walls*_{name}.json"))):
        if not re.fullmatch(r"walls\d+_" + re.escape(name) + r"\.json", os.path.basename(p)):
            continue
        with open(p) as f:
            steps = [s["wall_ms"] for s in json.load(f)["steps"] if not s["recorded"]]
        if steps:
            out.append(statistics.median(steps))
    return out


def sim_step(binary: str, profile: str, scen: str, out: str) -> float:
    d = os.path.join(out, "sim_" + os.path.basename(scen)[:-5])
    run([binary, "sim", scen, "--calibration", profile, "--out", d, "--overwrite"])
    with open(os.path.join(d, "summary.json")) as f:
        return json.load(f)["step_time_us"]["median"] / 1e3


def main() -> int:
    a = parser(__doc__, SCENARIOS).parse_args()
    os.makedirs(a.out, exist_ok=True)
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(a.scenarios, "*.toml")))
    steps = {}
    for n in names:
        reps = real_steps(a.runs, n)
        if reps:
            steps[n] = {"real_ms_per_rep": reps, "real_ms": statistics.median(reps),
                        "sim_ms": sim_step(a.bin, a.profile, os.path.join(a.scenarios, n + ".toml"), a.out)}
    rows = []
    for n in names:
        m = re.fullmatch(r"(.*)_streams(\d+)", n)
        base = m and m.group(1) + "_sequential"
        if not m or n not in steps or base not in steps:
            continue
        one, many = steps[base], steps[n]
        real = (many["real_ms"] / one["real_ms"] - 1) * 100
        sim = (many["sim_ms"] / one["sim_ms"] - 1) * 100
        per_rep = [(x / y - 1) * 100 for x, y in zip(many["real_ms_per_rep"], one["real_ms_per_rep"])]
        rows.append({"scenario": n, "streams": int(m.group(2)), "real_sequential_ms": one["real_ms"],
                     "real_streams_ms": many["real_ms"], "sim_sequential_ms": one["sim_ms"],
                     "sim_streams_ms": many["sim_ms"], "real_slowdown_pct": real, "sim_slowdown_pct": sim,
                     "points": sim - real, "real_slowdown_pct_per_rep": per_rep})
        reps = " ".join(f"{x:+.1f}" for x in per_rep)
        print(f"{n:26s} real {one['real_ms']:7.1f} -> {many['real_ms']:7.1f} ms {real:+6.1f}% (per rep {reps})  "
              f"sim {one['sim_ms']:7.1f} -> {many['sim_ms']:7.1f} ms {sim:+6.1f}%  difference {sim - real:+5.1f} points")
    with open(os.path.join(a.out, "streams.json"), "w") as f:
        json.dump({"profile": a.profile, "runs": a.runs, "steps": steps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
