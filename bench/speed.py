#!/usr/bin/env python3
"""The simulator's and the planner's speed figures (docs/performance.md).

Every figure is the CPU time (user + sys) and the peak RSS of one `threewalls` process, the minimum over
--runs runs (the build machine is shared: CPU time counts the process's own work, the minimum the least
disturbed run), each with its ratio to the same scenario in analytic fidelity and, with --baseline BIN, to
the same command run by another binary (e.g. the previous release's):

  sim DeepSeek-V3 2,048 GPUs (flow, analytic)       scenarios/examples/deepseek_v3_2048gpu.toml
  sim DeepSeek-V3 1,024 GPUs, TP2 PP8 VPP4          scenarios/examples/deepseek_v3_1024gpu.toml
  cost per extra GPU                                the 2,048-GPU example grown to 24,576 GPUs with the same
                                                    micro-batches per rank: (CPU, RSS) difference / 22,528
  threewalls --version                              the process floor of every non-GPU command
  plan with flow re-simulation                      DeepSeek-V3 1,024 GPUs and Qwen3-235B 256 GPUs, default
                                                    search: configurations per minute (wall and CPU), and
                                                    re-simulations per minute from --resim K against --resim 0
                                                    (K = 10, plan's default --top: every row re-simulated);
                                                    the same with --resim-method full (one run), and the
                                                    largest difference of a row's step time and walls
                                                    between the two methods
  plan --shard i/4                                  CPU and estimated configurations per shard, max / min
  sim with [run.profiler] ranks = "all", 256 GPUs   the Qwen3-235B example, run directory written
  sim inference, 100,000 GPUs (flow, analytic)      the Switch-like host-overhead seed (one GPU per replica)
                                                    on 100,000 nodes, ranks = "representatives"

  bench/speed.py [--bin build/cli/threewalls] [--baseline BIN] [--runs 3] [--tiny]

--tiny: small scenarios, one run each (the CI smoke test, Bench.SpeedScriptRunsOnATinyCase); it checks
that every step runs and prints its figure, nothing about time. Exit status 1 when a command failed.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
EXAMPLES = HERE / "scenarios" / "examples"


class Measure:
    """CPU seconds (user + sys), peak RSS (MiB) and wall seconds of the least-CPU run; stdout of that run."""

    def __init__(self, cpu_s, rss_mib, wall_s, stdout):
        self.cpu_s, self.rss_mib, self.wall_s, self.stdout = cpu_s, rss_mib, wall_s, stdout


failures = []


def run_once(argv, out_dir):
    if out_dir is not None:
        subprocess.run(["rm", "-rf", str(out_dir)], check=True)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=out, stderr=err, cwd=HERE)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            last = err.read().decode(errors="replace").strip().splitlines()[-1:] or ["(no message)"]
            raise RuntimeError(f"exit {p.returncode}: {last[0]}")
        # ru_maxrss is in KiB on Linux.
        return Measure(ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, wall, out.read().decode())


def measure(binary, args, runs, out_dir=None):
    """The minimum-CPU run of `binary args` (None when it failed; the failure is recorded)."""
    if binary is None:
        return None
    best = None
    for _ in range(runs):
        try:
            m = run_once([str(binary)] + [str(a) for a in args], out_dir)
        except RuntimeError as e:
            failures.append(f"{binary} {' '.join(map(str, args))}: {e}")
            print(f"speed.py: failed: {binary} {' '.join(map(str, args))}: {e}", file=sys.stderr)
            return None
        if best is None or m.cpu_s < best.cpu_s:
            best = m
    return best


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


HEAD = f"{'what':<50} {'CPU s':>8} {'MiB':>7} {'x analytic':>10} {'x baseline':>10} {'MiB x base':>10}"


def row(name, m, analytic=None, base=None):
    print(f"{name:<50} {fmt(m and m.cpu_s, '8.3f')} {fmt(m and m.rss_mib, '7.0f')} "
          f"{ratio(m and m.cpu_s, analytic and analytic.cpu_s):>10} {ratio(m and m.cpu_s, base and base.cpu_s):>10} "
          f"{ratio(m and m.rss_mib, base and base.rss_mib):>10}", flush=True)


def grown(src, work, name, factor):
    """A copy of scenario `src` with `factor` times the nodes and the global batch (same micro-batches per rank)."""
    text = src.read_text()
    out = []
    for line in text.splitlines():
        m = re.match(r"^(nodes|global_batch_size) = (\d+)\s*$", line)
        if m:
            line = f"{m.group(1)} = {int(m.group(2)) * factor}"
        elif line.startswith("name = "):
            line = f'name = "{name}"'
        out.append(line)
    p = work / f"{name}.toml"
    p.write_text("\n".join(out) + "\n")
    return p


def gpus_of(path):
    text = path.read_text()
    g = int(re.search(r"^gpus_per_node = (\d+)", text, re.M).group(1))
    n = int(re.search(r"^nodes = (\d+)", text, re.M).group(1))
    return g * n


def with_all_ranks(src, work):
    text = src.read_text()
    if "[run.profiler]" not in text:
        raise SystemExit(f"speed.py: {src} has no [run.profiler] table")
    text = re.sub(r'^ranks = .*\n', "", text, flags=re.M).replace("[run.profiler]\n", '[run.profiler]\nranks = "all"\n')
    p = work / f"{src.stem}_all_ranks.toml"
    p.write_text(text)
    return p


def inference_world(work, nodes):
    """The one-GPU Switch-like inference seed on `nodes` one-GPU nodes, recording one rank per class."""
    src = HERE / "scenarios" / "validation" / "host_overhead" / "switch_d768_t4k_sequential_none.toml"
    text = re.sub(r"^nodes = \d+\s*$", f"nodes = {nodes}", src.read_text(), flags=re.M)
    if "[run.profiler]\n" not in text:
        raise SystemExit(f"speed.py: {src} has no [run.profiler] table")
    text = text.replace("[run.profiler]\n", '[run.profiler]\nranks = "representatives"\n')
    p = work / f"{src.stem}_{nodes}.toml"
    p.write_text(text)
    return p


def steady_against_full(binary, cmd, k, m0, steady):
    """The planner's steady-state re-simulations (the default) against every micro-batch simulated
    (--resim-method full, one run): its rate, and the largest difference of a row's flow step time
    and walls."""
    full = measure(binary, cmd + ["--resim", k, "--resim-method", "full"], 1)
    if not full:
        return
    dw, dc = full.wall_s - m0.wall_s, full.cpu_s - m0.cpu_s
    print(f"{'  --resim-method full: re-simulations/min (wall, CPU)':<50} {fmt(k / dw * 60 if dw > 0 else None, '8.1f')} "
          f"{fmt(k / dc * 60 if dc > 0 else None, '7.1f')}")
    step, walls, shortened = 0.0, 0.0, 0
    rows_s, rows_f = json.loads(steady.stdout)["top"], json.loads(full.stdout)["top"]
    for s, f in zip(rows_s, rows_f):
        if "flow" not in s or "flow" not in f:
            failures.append(f"plan {cmd[1]}: a top row without its flow re-simulation")
            continue
        s, f = s["flow"], f["flow"]
        shortened += s.get("steady_round", 0) > 0
        step = max(step, abs(s["step_time_us"] / f["step_time_us"] - 1.0))
        walls = max([walls] + [abs(s["walls"][w] - f["walls"][w]) / f["step_time_us"] for w in f["walls"]])
    print(f"{'  steady against full: step, walls (% of step)':<50} {100 * step:8.3f} {100 * walls:7.3f} "
          f"({shortened} of {len(rows_s)} rows from a short step's period)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(HERE / "build" / "cli" / "threewalls"))
    ap.add_argument("--baseline", default=None, help="another threewalls binary to compare with")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="small scenarios, one run each (smoke test)")
    a = ap.parse_args()
    binary = Path(a.bin).resolve()
    base = Path(a.baseline).resolve() if a.baseline else None
    for b, what in ((binary, "--bin"), (base, "--baseline")):
        if b is not None and not os.access(b, os.X_OK):
            raise SystemExit(f"speed.py: {what} {b} is not an executable (build it, or pass {what})")
    if a.runs < 1:
        raise SystemExit("speed.py: --runs must be a positive integer")
    runs = 1 if a.tiny else a.runs

    if a.tiny:
        big = mid = EXAMPLES / "small_moe_ep4.toml"
        grow = 2
        plans = [(EXAMPLES / "small_moe_ep4.toml", 4, "tp=1,2;ep=1..4")]
        prof = EXAMPLES / "small_moe_ep4.toml"
        k = 2
        replicas = 64
    else:
        big = EXAMPLES / "deepseek_v3_2048gpu.toml"
        mid = EXAMPLES / "deepseek_v3_1024gpu.toml"
        grow = 12
        plans = [(EXAMPLES / "deepseek_v3_1024gpu.toml", 1024, None), (EXAMPLES / "qwen3_235b_256gpu.toml", 256, None)]
        prof = EXAMPLES / "qwen3_235b_256gpu.toml"
        # plan's default (--top 10, every row re-simulated): what a user's plan runs. With fewer rows
        # most children run while the parent is still sweeping, and the difference against --resim 0
        # reads faster than the re-simulations are.
        k = 10
        replicas = 100000

    load = os.getloadavg()[0]
    print(f"threewalls speed: {binary}" + (f" against {base}" if base else ""))
    print(f"{os.cpu_count()} cores, load average {load:.2f} at start; CPU = user + sys, minimum of {runs} run(s)")
    print()
    print(HEAD)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sim = ["sim", "--no-run-dir", "--steps", "1"]
        for path in (big, mid):
            an = measure(binary, sim + [path, "--fidelity", "analytic"], runs)
            row(f"sim {path.stem} analytic", an, None, measure(base, sim + [path, "--fidelity", "analytic"], runs))
            fl = measure(binary, sim + [path, "--fidelity", "flow"], runs)
            row(f"sim {path.stem} flow", fl, an, measure(base, sim + [path, "--fidelity", "flow"], runs))

        # Cost per extra GPU: the same work per rank on `grow` times the GPUs.
        n0 = gpus_of(big)
        large = grown(big, work, f"{big.stem}_x{grow}", grow)
        n1 = gpus_of(large)
        per_gpu = {}
        for fid in ("analytic", "flow"):
            for who, b in (("bin", binary), ("base", base)):
                m0 = measure(b, sim + [big, "--fidelity", fid], runs)
                m1 = measure(b, sim + [large, "--fidelity", fid], runs)
                if m0 and m1:
                    per_gpu[(fid, who)] = ((m1.cpu_s - m0.cpu_s) / (n1 - n0) * 1e6,
                                           (m1.rss_mib - m0.rss_mib) * 1024 / (n1 - n0), m1)
        for fid in ("analytic", "flow"):
            mine = per_gpu.get((fid, "bin"))
            theirs = per_gpu.get((fid, "base"))
            an = per_gpu.get(("analytic", "bin"))
            us = fmt(mine and mine[0], ".1f")
            kib = fmt(mine and mine[1], ".2f")
            print(f"{'sim ' + large.stem + ' ' + fid:<50} {fmt(mine and mine[2].cpu_s, '8.3f')} "
                  f"{fmt(mine and mine[2].rss_mib, '7.0f')}")
            print(f"{'  per extra GPU (' + str(n0) + ' -> ' + str(n1) + '): us CPU, KiB':<50} {us:>8} {kib:>7} "
                  f"{ratio(mine and mine[0], an and an[0]) if fid == 'flow' else '-':>10} "
                  f"{ratio(mine and mine[0], theirs and theirs[0]):>10} {ratio(mine and mine[1], theirs and theirs[1]):>10}")

        row("threewalls --version (process floor)", measure(binary, ["--version"], runs), None,
            measure(base, ["--version"], runs))

        # The planner: the whole command with K flow re-simulations, and without.
        for path, gpus, search in plans:
            cmd = ["plan", path, "--gpus", gpus, "--top", k, "--format", "json"]
            if search:
                cmd += ["--search", search]
            for who, b in (("", binary), (" (baseline)", base)):
                if b is None:
                    continue
                m0 = measure(b, cmd + ["--resim", 0], runs)
                mk = measure(b, cmd + ["--resim", k], runs)
                if not (m0 and mk):
                    continue
                total = json.loads(mk.stdout)["counters"]["total"]
                row(f"plan {path.stem} --gpus {gpus} --resim 0{who}", m0)
                print(f"{'  configurations/min (CPU)':<50} {total / m0.cpu_s * 60:8.0f}")
                row(f"plan {path.stem} --gpus {gpus} --resim {k}{who}", mk)
                print(f"{'  configurations/min (wall, CPU)':<50} {total / mk.wall_s * 60:8.0f} {total / mk.cpu_s * 60:7.0f}")
                dw, dc = mk.wall_s - m0.wall_s, mk.cpu_s - m0.cpu_s
                print(f"{'  flow re-simulations/min (wall, CPU)':<50} {fmt(k / dw * 60 if dw > 0 else None, '8.1f')} "
                      f"{fmt(k / dc * 60 if dc > 0 else None, '7.1f')}", flush=True)
                if b is binary:
                    steady_against_full(b, cmd, k, m0, mk)

        # Shards: the first plan scenario in 4 shards.
        path, gpus, search = plans[0]
        for who, b in (("", binary), (" (baseline)", base)):
            if b is None:
                continue
            cpu, est = [], []
            for i in range(4):
                cmd = ["plan", path, "--gpus", gpus, "--shard", f"{i}/4", "--format", "json"]
                if search:
                    cmd += ["--search", search]
                m = measure(b, cmd, runs)
                if m:
                    cpu.append(m.cpu_s)
                    est.append(json.loads(m.stdout)["counters"]["estimated"])
            if len(cpu) == 4:
                print(f"plan --shard i/4{who}: CPU s " + " ".join(f"{c:.2f}" for c in cpu) +
                      f" (max/min {ratio(max(cpu), min(cpu))}); estimated " + " ".join(map(str, est)) +
                      f" (max/min {ratio(max(est), min(est))})")

        world = inference_world(work, replicas)
        an = measure(binary, sim + [world, "--fidelity", "analytic"], runs)
        row(f"sim inference {replicas} GPUs analytic", an, None, measure(base, sim + [world, "--fidelity", "analytic"], runs))
        fl = measure(binary, sim + [world, "--fidelity", "flow"], runs)
        row(f"sim inference {replicas} GPUs flow", fl, an, measure(base, sim + [world, "--fidelity", "flow"], runs))

        all_ranks = with_all_ranks(prof, work)
        out = work / "run"
        prof_cmd = ["sim", all_ranks, "--steps", "1", "--out", out]
        row(f'sim {prof.stem} ranks="all" ({gpus_of(prof)} GPUs)', measure(binary, prof_cmd, runs, out), None,
            measure(base, prof_cmd, runs, out))

    if failures:
        print(f"\n{len(failures)} command(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
