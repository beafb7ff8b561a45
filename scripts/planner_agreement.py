#!/usr/bin/env python3
"""The planner's estimator against the simulator, layout by layout (docs/planner.md, "Agreement with the simulator").

For each row (an example scenario, its GPU count and a --search that pins one layout) it runs
`threewalls plan` (the estimator's step time), then `threewalls sim --fidelity analytic` and
`threewalls sim` (flow fidelity) on the planner's top_1.toml (one step, profiler off), and prints the
Markdown table of docs/planner.md. Run it from the repository root after a change of the estimator,
the simulator or the shipped profile:

    scripts/planner_agreement.py build/cli/threewalls [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# (label, scenario, GPUs, pinned search, options shown in the table)
ROWS = [
    ("Mixtral-8x7B, 64", "scenarios/examples/mixtral_8x7b_64gpu.toml", 64,
     "tp=1;pp=4;vpp=1;ep=8;mbs=1;recompute=selective;dispatcher=alltoall", "mbs1 selective alltoall"),
    ("Mixtral-8x7B, 64", "scenarios/examples/mixtral_8x7b_64gpu.toml", 64,
     "tp=2;pp=2;vpp=4;ep=8;mbs=2;recompute=none", "mbs2 none"),
    ("Mixtral-8x7B, 64", "scenarios/examples/mixtral_8x7b_64gpu.toml", 64,
     "tp=1;pp=8;vpp=1;ep=8;mbs=1;recompute=full", "mbs1 full"),
    ("Mixtral-8x7B, 64", "scenarios/examples/mixtral_8x7b_64gpu.toml", 64,
     "tp=1;pp=4;vpp=2;ep=8;mbs=1;recompute=selective;dispatcher=flex", "mbs1 selective flex"),
    ("Mixtral-8x7B, 64", "scenarios/examples/mixtral_8x7b_64gpu.toml", 64,
     "tp=2;pp=4;vpp=2;ep=8;mbs=1;recompute=selective;cuda_graphs=attn+moe_router", "mbs1 selective, graphs attn+moe_router"),
    ("Qwen3-235B, 256", "scenarios/examples/qwen3_235b_256gpu.toml", 256,
     "tp=2;pp=8;vpp=4;ep=32;mbs=1;recompute=selective;dispatcher=alltoall", "mbs1 selective alltoall (Megatron's)"),
    ("Qwen3-235B, 256", "scenarios/examples/qwen3_235b_256gpu.toml", 256,
     "tp=2;pp=8;vpp=4;ep=32;recompute=selective;dispatcher=flex;precision=fp8", "selective flex fp8"),
    ("Qwen3-235B, 256", "scenarios/examples/qwen3_235b_256gpu.toml", 256,
     "tp=1;pp=16;vpp=1;ep=16;recompute=full", "full"),
    ("Qwen3-235B, 256", "scenarios/examples/qwen3_235b_256gpu.toml", 256,
     "tp=2;pp=8;vpp=1;ep=8;recompute=selective;dispatcher=flex", "selective flex"),
    ("DeepSeek-V3, 1,024", "scenarios/examples/deepseek_v3_1024gpu.toml", 1024,
     "tp=2;pp=8;vpp=4;ep=64;mbs=1;recompute=selective;dispatcher=alltoall", "mbs1 selective alltoall (Megatron's)"),
    ("DeepSeek-V3, 1,024", "scenarios/examples/deepseek_v3_1024gpu.toml", 1024,
     "tp=1;pp=16;vpp=1;ep=64;recompute=full", "full"),
    ("DeepSeek-V3, 1,024", "scenarios/examples/deepseek_v3_1024gpu.toml", 1024,
     "tp=4;pp=16;vpp=1;ep=16;mbs=1;recompute=none;dispatcher=flex", "mbs1 none flex"),
]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"planner_agreement: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def sim_step_seconds(tw, toml, out, fidelity):
    """The median step time of one simulated step (summary.json of the run directory), in seconds."""
    run([tw, "sim", toml, "--fidelity", fidelity, "--steps", "1", "--out", out])
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["step_time_us"]["median"] * 1e-6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("threewalls", help="the threewalls binary")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    tw = os.path.abspath(args.threewalls)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, scenario, gpus, search, options) in enumerate(ROWS):
            out = os.path.join(tmp, f"plan_{i}")
            run([tw, "plan", scenario, "--gpus", str(gpus), "--search", search, "--top", "1", "--out", out,
                 "--quiet"])
            plan = json.load(open(os.path.join(out, "plan.json")))
            if not plan["top"]:
                sys.exit(f"planner_agreement: row {i} ({search}): no estimated layout (out of memory or pruned)")
            top = plan["top"][0]
            lay = top["layout"]
            layout = f"tp{lay['tp']} pp{lay['pp']} vpp{lay['vpp']} ep{lay['ep']}"
            est = top["step_time_us"] * 1e-6
            toml = os.path.join(out, "top_1.toml")
            analytic = sim_step_seconds(tw, toml, os.path.join(tmp, f"analytic_{i}"), "analytic")
            flow = sim_step_seconds(tw, toml, os.path.join(tmp, f"flow_{i}"), "flow")
            rows.append({"scenario": label, "layout": layout, "options": options, "search": search,
                         "estimator_s": est, "sim_analytic_s": analytic, "sim_flow_s": flow,
                         "estimator_vs_flow_pct": 100.0 * (est - flow) / flow})
            print(f"| {label} | {layout} | {options} | {est:.3f} | {analytic:.3f} | {flow:.3f} | "
                  f"{rows[-1]['estimator_vs_flow_pct']:+.1f}% |", flush=True)
    errs = [abs(r["estimator_vs_flow_pct"]) for r in rows]
    print(f"\nwithin {max(errs):.1f}% of flow fidelity on all {len(rows)} (mean absolute {sum(errs) / len(errs):.1f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
