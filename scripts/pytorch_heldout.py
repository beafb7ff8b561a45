#!/usr/bin/env python3
"""The reference runner's held-out steps against the simulation of the same scenarios.

    scripts/pytorch_heldout.py --bin build/cli/threewalls --profile P.toml --runs DIR --out OUT [NAME ...]

DIR holds what a GPU machine wrote for each held-out scenario NAME of python/scenarios/heldout/:
`run_NAME/` (python3 -m threewalls.runner python/scenarios/heldout/NAME.toml --out run_NAME; another
folder of scenarios with --scenarios) and
`walls_NAME.json` (its --wall-json). For each, this simulates the scenario with the profile
(`threewalls sim`), compares the run with the simulation (`threewalls compare --json`), and prints one
row: the recorded steps (the steps of the phase records) real and simulated, the unrecorded ones (the
real run's host clock; the simulation's steps that its scenario's profiler does not record), the
error of each, peak memory, and every phase of at least 5% of the real recorded step with its error
(with --also PHASE,...: those phases too, whatever their share, e.g. the all-to-alls of the two-GPU
scenarios of python/scenarios/ep2/, with their medians). Writes OUT/heldout.json with the same figures. The targets (docs/python.md): step and
phases within 10% with grouped experts, 20% with the eager loop, peak memory within 10%.

A run with a host probe (the runner's, on a GPU: run.json settings.executor.device.host_probe) is also
simulated at its own host speed (`threewalls sim --host-scale`, the scale `threewalls compare` prints
for it) and compared again: a column beside the prediction, not a prediction (heldout.json's
`host_probe`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELDOUT = os.path.join(ROOT, "python", "scenarios", "heldout")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 1):  # compare exits 1 only with --fail-above
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
    return r


def sim_unrecorded_ms(scen: str, sim_dir: str):
    """Median of the simulation's steps that its scenario's profiler does not record (summary.json's
    steps, numbered from the first measured step as the runner numbers them), ms; None if every step
    records."""
    with open(scen, "rb") as f:
        prof = tomllib.load(f).get("run", {}).get("profiler", {})
    start, every = prof.get("start_step", 0), prof.get("record_every_n_steps", 10)
    end, enabled = prof.get("end_step", -1), prof.get("enabled", True)
    with open(os.path.join(sim_dir, "summary.json")) as f:
        steps = json.load(f)["steps"]

    def recorded(k: int) -> bool:
        return enabled and k >= start and (end < 0 or k <= end) and (k - start) % every == 0

    un = [s["step_time_us"] / 1e3 for s in steps if not recorded(s["step"])]
    return statistics.median(un) if un else None


def pct(x) -> str:
    """An error in percent, or '-' where there is none (a run without a measured peak: a CPU run)."""
    return "      -" if x is None else f"{x:+6.1f}%"


def parser(doc: str, scenarios: str) -> argparse.ArgumentParser:
    """The options of a comparison of reference-runner runs with simulations: the binary, the profile,
    the runs' folder, the output folder and the scenarios' folder."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenarios", default=scenarios, help="folder of the scenarios NAME.toml (default: %(default)s)")
    return ap


def main() -> int:
    ap = parser(__doc__, HELDOUT)
    ap.add_argument("--also", default="", metavar="PHASE,...",
                    help="phases to list whatever their share of the step (their medians and errors), e.g. "
                         "moe_dispatch_fwd,moe_combine_fwd")
    ap.add_argument("names", nargs="*", help="held-out scenarios (default: every run_NAME in --runs)")
    a = ap.parse_args()
    names = a.names or sorted(d[4:] for d in os.listdir(a.runs) if d.startswith("run_")
                              and os.path.isdir(os.path.join(a.runs, d)))
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for n in names:
        scen = os.path.join(a.scenarios, n + ".toml")
        if not os.path.isfile(scen):
            sys.exit(f"{scen}: no such held-out scenario")
        sim = os.path.join(a.out, "sim_" + n)
        run([a.bin, "sim", scen, "--calibration", a.profile, "--out", sim, "--overwrite"])
        cj = os.path.join(a.out, "compare_" + n + ".json")
        run([a.bin, "compare", os.path.join(a.runs, "run_" + n), sim, "--json", cj])
        with open(cj) as f:
            c = json.load(f)
        walls = {}
        wp = os.path.join(a.runs, "walls_" + n + ".json")
        if os.path.isfile(wp):
            with open(wp) as f:
                walls = json.load(f).get("median_ms", {})
        st = c["step_time_us"]
        real_ms, sim_ms = st["a"]["median"] / 1e3, st["b"]["median"] / 1e3
        unrec = walls.get("unrecorded")
        sim_unrec = sim_unrecorded_ms(scen, sim)
        row = {"scenario": n, "real_recorded_ms": real_ms, "real_unrecorded_ms": unrec, "sim_ms": sim_ms,
               "sim_unrecorded_ms": sim_unrec, "step_error_pct": st["median_error_pct"],
               "step_error_vs_unrecorded_pct": (sim_unrec - unrec) / unrec * 100 if unrec and sim_unrec else None,
               "peak_memory_error_pct": c["peak_memory_bytes"].get("error_pct"),
               "phases": [{"phase": p["phase"], "share_pct": p["share_of_a"] * 100,
                           "error_pct": p["median_error_pct"]} for p in c["phases"] if p["share_of_a"] >= 0.05]}
        also = [x for x in a.also.split(",") if x]
        row["also"] = [{"phase": p["phase"], "share_pct": p["share_of_a"] * 100, "count": p["count"],
                        "real_median_us": p["a"]["median_us"], "sim_median_us": p["b"]["median_us"],
                        "error_pct": p["median_error_pct"]} for p in c["phases"] if p["phase"] in also]
        # At the run's own host speed: its host probe (the runner's torch_eager_op_us) over the
        # profile's charge for the same op, as `threewalls compare` prints it; not a prediction.
        probe = c.get("host_probe")
        if probe and probe.get("host_scale_for_the_run"):
            hs = probe["host_scale_for_the_run"]
            sim_p = os.path.join(a.out, "sim_probe_" + n)
            run([a.bin, "sim", scen, "--calibration", a.profile, "--out", sim_p, "--overwrite", "--host-scale",
                 f"{hs:.4f}"])
            cjp = os.path.join(a.out, "compare_probe_" + n + ".json")
            run([a.bin, "compare", os.path.join(a.runs, "run_" + n), sim_p, "--json", cjp])
            with open(cjp) as f:
                cp = json.load(f)
            sup = sim_unrecorded_ms(scen, sim_p)
            row["host_probe"] = {
                "host_scale": hs, "probe_us": probe["probe_us"], "charged_us": probe["charged_us"],
                "sim_ms": cp["step_time_us"]["b"]["median"] / 1e3, "step_error_pct": cp["step_time_us"]["median_error_pct"],
                "sim_unrecorded_ms": sup,
                "step_error_vs_unrecorded_pct": (sup - unrec) / unrec * 100 if unrec and sup else None,
                "phases": [{"phase": p["phase"], "share_pct": p["share_of_a"] * 100, "error_pct": p["median_error_pct"]}
                           for p in cp["phases"] if p["share_of_a"] >= 0.05]}
        rows.append(row)
        un = f"{unrec:8.1f}" if unrec else "       -"
        su = f"{sim_unrec:8.1f}" if sim_unrec else "       -"
        ue = f"{row['step_error_vs_unrecorded_pct']:+6.1f}%" if row["step_error_vs_unrecorded_pct"] is not None else "      -"
        print(f"{n:28s} recorded: real {real_ms:8.1f} ms sim {sim_ms:8.1f} {row['step_error_pct']:+6.1f}%  "
              f"unrecorded: real {un} sim {su} {ue}  peak memory {pct(row['peak_memory_error_pct'])}")
        hp = row.get("host_probe")
        if hp:
            ue_p = hp["step_error_vs_unrecorded_pct"]
            print(f"{'':28s} at the run's host probe (host scale {hp['host_scale']:.3f}): recorded "
                  f"{hp['step_error_pct']:+6.1f}%  unrecorded {pct(ue_p)}")
        for p in row["phases"]:
            print(f"    {p['phase']:28s} {p['share_pct']:5.1f}% of the step  error {p['error_pct']:+6.1f}%")
        for p in row["also"]:
            print(f"    {p['phase']:28s} {p['share_pct']:5.1f}% of the step  median real {p['real_median_us']:8.1f} us "
                  f"sim {p['sim_median_us']:8.1f} us  error {p['error_pct']:+6.1f}%")
    with open(os.path.join(a.out, "heldout.json"), "w") as f:
        json.dump({"profile": a.profile, "runs": a.runs, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
