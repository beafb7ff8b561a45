#!/usr/bin/env python3
"""Validate the simulator against real runs, in one call on a GPU machine.

For every scenario of a suite: run it for real (`threewalls run`), simulate it with the calibration
profile of this machine (`threewalls sim`), compare the two (`threewalls compare`, real = reference),
and write a table: step-time error, per-phase median error of the phases that take >= 5% of the step,
peak-memory error, and the predicted vs measured speed-up of the suite's pairs.

    scripts/validate_suite.py --bin build/cli/threewalls --kind h200 \
        [--profile calibration/profiles/h200.toml | --calibrate [--quick]] \
        --out OUT scenarios/validation/fidelity

With --recalibrate GROUPS, each real run is preceded by a calibration of those groups on its GPU
(`threewalls calibrate --only GROUPS --fill-from PROFILE`, quick unless --recalibrate-full; host
quick: about 5 s; copy needs full for the disk tier): the scenario is simulated with that profile
(those families measured seconds before the run, the rest from PROFILE) and, for comparison, with
PROFILE alone. A host or a virtual disk whose speed drifts over minutes (a VM) otherwise moves
launch-bound or disk-bound steps by more than the model's error; the table shows both.

With --repeat N, each scenario runs N times, each its own process, in N passes over the suite; the
process whose step-time median is the median of the N is compared (launch-bound steps on a VM
differ by 20-30% from one process to the next, while the steps inside one process agree within a
few percent: docs/validation/host_overhead.md).

Every real run measures its own host before its first step (run.json settings.executor.device.host_probe:
an op launch and two cuBLASLt GEMM calls through OpRunner). Where the probe is there, the scenario is also
simulated with the profile's host costs scaled by probe / profile (the ratio `threewalls compare` reports,
passed to `threewalls sim --host-scale`), and the
table shows that error beside the prediction's: how much of a launch-bound step's error is this process's
host speed rather than the model (not a prediction: the probe comes from the run).

Where a real run read experts from disk (the NVMe tier), the scenario is also simulated with
the disk as fast as the run's own reads were (`threewalls sim --disk-scale` = the summed duration of the
run's expert_fetch_disk records over the prediction's), and the table shows both rates and that error:
how much of a disk-bound step's error is the disk's speed during the run (not a prediction either).

Scenarios that need more GPUs than the machine has are listed as skipped, never dropped silently.
Single-GPU scenarios run concurrently, one per GPU (CUDA_VISIBLE_DEVICES). Python 3 standard library only.
"""
import argparse
import concurrent.futures as futures
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time


def log(*a):
    print(*a, flush=True)


def world_size(toml_path):
    text = open(toml_path, encoding="utf-8").read()
    cluster = text.split("[cluster]", 1)[-1]
    g = re.search(r"^\s*gpus_per_node\s*=\s*(\d+)", cluster, re.M)
    n = re.search(r"^\s*nodes\s*=\s*(\d+)", cluster, re.M)
    return int(g.group(1)) * int(n.group(1))


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
        return len([l for l in out.splitlines() if l.startswith("GPU ")])
    except (OSError, subprocess.CalledProcessError):
        return 0


def run(cmd, env=None, logfile=None, timeout=None):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    dt = time.time() - t0
    if logfile:
        with open(logfile, "a", encoding="utf-8") as f:
            f.write("$ " + " ".join(cmd) + f"\n# rc={p.returncode} {dt:.1f}s\n" + p.stdout + p.stderr + "\n")
    return p.returncode, p.stdout, p.stderr, dt


def host_figures(profile_path):
    """Kernel launch, one-node GEMM call and recording path (us) of a profile, for the drift column."""
    try:
        import tomllib
        with open(profile_path, "rb") as f:
            doc = tomllib.load(f)
        host = doc.get("host", {})
    except (OSError, ImportError, ValueError):
        return {}
    def fit(name, key):
        v = host.get(name, {}).get("fit", {}).get(key)
        return None if v is None else v * 1e6
    out = {"kernel_launch_us": fit("kernel_launch", "value_s"), "gemm_call_us": fit("gemm_call", "t_one_s"),
           "record_op_us": fit("record_op", "value_s")}
    pts = [pt for pt in doc.get("copy", {}).get("disk_read", {}).get("points", []) if pt.get("median_s")]
    if pts:
        pt = min(pts, key=lambda pt: abs(pt.get("bytes", 0) - (16 << 20)))
        out["disk_GBps"] = pt["bytes"] / pt["median_s"] / 1e9
    return out


def disk_read_rates(real_dir, sim_dir):
    """The disk-read rate a run's NVMe-tier reads achieved against the simulated rate of the same reads:
    bytes over the summed durations of the expert_fetch_disk records of every recorded step
    of each side. scale = real time / simulated time, what `threewalls sim --disk-scale` takes to give
    the disk the speed it had during the run (not a prediction: it comes from the run). None without
    disk reads."""
    def totals(run_dir):
        nbytes = dur_us = 0.0
        for name in sorted(os.listdir(run_dir)):
            if not (name.startswith("phases_rank_") and name.endswith(".jsonl")):
                continue
            with open(os.path.join(run_dir, name)) as f:
                for line in f:
                    if '"expert_fetch_disk"' not in line:
                        continue
                    rec = json.loads(line)
                    if rec.get("phase") == "expert_fetch_disk":
                        nbytes += rec.get("bytes", 0.0)
                        dur_us += rec.get("dur_us", 0.0)
        return nbytes, dur_us

    try:
        rb, rd = totals(real_dir)
        sb, sd = totals(sim_dir)
    except OSError:
        return None
    if rd <= 0 or sd <= 0 or rb <= 0:
        return None
    return {"scale": rd / sd, "real_GBps": rb / rd / 1e3, "sim_GBps": sb / sd / 1e3}


def fmt(x, digits=1):
    return "n/a" if x is None else f"{x:+.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="threewalls binary (a CUDA build)")
    ap.add_argument("--kind", required=True, choices=["h100", "h200"], help="GPU kind of this machine")
    ap.add_argument("--profile", help="calibration profile for the simulator")
    ap.add_argument("--calibrate", action="store_true", help="calibrate this machine first and use that profile")
    ap.add_argument("--quick", action="store_true", help="with --calibrate: quick mode")
    ap.add_argument("--out", required=True, help="output folder (must not exist)")
    ap.add_argument("--pairs", help="JSON file of speed-up pairs [[base, variant, label], ...] (default: SUITE/pairs.json)")
    ap.add_argument("--sim-only", action="store_true", help="skip real runs, reuse OUT/real (re-simulate and compare)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per real run")
    ap.add_argument("--steps", type=int, help="steps per scenario instead of its run.steps, in the real run and the "
                    "simulation alike (warm-up steps unchanged); for scenarios whose steps are slow (NVMe tier)")
    ap.add_argument("--recalibrate", metavar="GROUPS",
                    help="calibrate these groups (calibrate --only, e.g. host or copy) right before each real run, "
                    "filled from --profile; the scenario is simulated with it (and with --profile alone)")
    ap.add_argument("--recalibrate-full", action="store_true", help="with --recalibrate: full mode (disk tier)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="real runs per scenario, each its own process, in passes over the suite; the process with "
                    "the median step time is compared and the table gives the spread (a VM's launch-bound steps "
                    "differ by 20-30%% from process to process)")
    ap.add_argument("suites", nargs="+", help="scenario folders or files")
    a = ap.parse_args()

    if os.path.exists(a.out) and not a.sim_only:
        sys.exit(f"validate_suite: {a.out} exists; results are never overwritten")
    for d in ("real", "sim", "compare", "logs"):
        os.makedirs(os.path.join(a.out, d), exist_ok=True)
    logfile = os.path.join(a.out, "logs", "commands.log")

    scenarios, pair_files = [], []
    for s in a.suites:
        if os.path.isdir(s):
            scenarios += sorted(os.path.join(s, f) for f in os.listdir(s) if f.endswith(".toml"))
            if os.path.exists(os.path.join(s, "pairs.json")):
                pair_files.append(os.path.join(s, "pairs.json"))
        else:
            scenarios.append(s)
    if a.pairs:
        pair_files = [a.pairs]

    steps_arg = ["--steps", str(a.steps)] if a.steps else []
    gpus = gpu_count()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    log(f"validate_suite: {len(scenarios)} scenarios, {gpus} GPUs ({a.kind}), started {started}")

    profile = a.profile
    calib_seconds = None
    if a.calibrate:
        profile = os.path.join(a.out, f"{a.kind}_profile.toml")
        cmd = [a.bin, "calibrate", "--out", profile] + (["--quick"] if a.quick else [])
        rc, out, err, calib_seconds = run(cmd, logfile=logfile)
        open(os.path.join(a.out, "logs", "calibrate.txt"), "w").write(out + err)
        log(out[-4000:])
        if rc != 0:
            sys.exit(f"validate_suite: calibration failed (rc {rc}): {err[-2000:]}")
    if not profile:
        sys.exit("validate_suite: give --profile or --calibrate")
    profile = os.path.abspath(profile)
    host_dir = os.path.join(a.out, "host_profiles")
    if a.recalibrate:
        os.makedirs(host_dir, exist_ok=True)

    names = {s: os.path.splitext(os.path.basename(s))[0] for s in scenarios}
    need = {s: world_size(s) for s in scenarios}
    results = {s: {"name": names[s], "gpus": need[s]} for s in scenarios}

    # ---- real runs: single-GPU ones concurrently (one per GPU), the rest one after another ----
    def tag(s, rep):  # the run directory (and recalibrated profile) of repetition `rep`
        return names[s] if a.repeat == 1 else f"{names[s]}__rep{rep}"

    def real(s, devices, rep=0):
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", CUDA_VISIBLE_DEVICES=",".join(map(str, devices)))
        out = os.path.join(a.out, "real" if a.repeat == 1 else "real_repeats", tag(s, rep))
        if a.recalibrate:
            hp = os.path.join(host_dir, tag(s, rep) + ".toml")
            cmd = [a.bin, "calibrate", "--only", a.recalibrate, "--fill-from", profile, "--overwrite", "--out", hp,
                   "--raw-out", os.path.join(host_dir, tag(s, rep) + "_raw")] + ([] if a.recalibrate_full else ["--quick"])
            try:
                rc, so, se, dt = run(cmd, env=env, logfile=logfile, timeout=180)
            except subprocess.TimeoutExpired:
                rc, se = -1, "timed out after 180 s"
            if rc != 0:
                return s, -1, "", "recalibration failed: " + se[-1000:], 0.0
        try:
            rc, so, se, dt = run([a.bin, "run", s, "--out", out] + steps_arg, env=env, logfile=logfile, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            return s, -1, "", f"timed out after {a.timeout} s", a.timeout
        return s, rc, so, se, dt

    def record_real(s, rc, so, se, dt, rep):
        results[s].setdefault("real_rcs", []).append(rc)
        results[s]["real_seconds"] = round(results[s].get("real_seconds", 0.0) + dt, 1)
        if rc != 0:
            results[s]["error"] = (se or so)[-1500:]
        results[s]["real_rc"] = max(results[s]["real_rcs"], key=abs)
        log(f"  real {tag(s, rep):46s} rc={rc} {dt:6.1f}s")

    if not a.sim_only:
        runnable = [s for s in scenarios if need[s] <= gpus]
        for s in scenarios:
            if need[s] > gpus:
                results[s]["skipped"] = f"needs {need[s]} GPUs, machine has {gpus}"
        singles = [s for s in runnable if need[s] == 1]
        multis = [s for s in runnable if need[s] > 1]
        # Repetitions in passes over the suite: a drift of the machine spreads over every scenario.
        with futures.ThreadPoolExecutor(max_workers=max(1, gpus)) as pool:
            queue = [(s, rep) for rep in range(a.repeat) for s in singles]
            running = {}
            free = list(range(gpus))
            while queue or running:
                while queue and free:
                    dev = free.pop(0)
                    s, rep = queue.pop(0)
                    running[pool.submit(real, s, [dev], rep)] = (dev, rep)
                done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
                for f in done:
                    dev, rep = running.pop(f)
                    free.append(dev)
                    record_real(*f.result(), rep)
        for rep in range(a.repeat):
            for s in multis:
                record_real(*real(s, list(range(need[s])), rep), rep)
        if a.repeat > 1:
            # The compared run is the process whose step-time median is the median of the processes'
            # (the upper middle one for an even count); the table gives all of them.
            for s in runnable:
                if results[s].get("real_rc", 0) != 0:
                    continue
                meds = []
                for rep in range(a.repeat):
                    d = os.path.join(a.out, "real_repeats", tag(s, rep))
                    meds.append((json.load(open(os.path.join(d, "summary.json")))["step_time_us"]["median"], rep))
                meds.sort()
                chosen = meds[len(meds) // 2][1]
                results[s]["real_step_ms_per_process"] = [round(m / 1000.0, 3) for m, _ in sorted(meds, key=lambda t: t[1])]
                results[s]["real_chosen_repetition"] = chosen
                shutil.copytree(os.path.join(a.out, "real_repeats", tag(s, chosen)), os.path.join(a.out, "real", names[s]))
                if a.recalibrate:
                    shutil.copy(os.path.join(host_dir, tag(s, chosen) + ".toml"), os.path.join(host_dir, names[s] + ".toml"))

    # ---- simulate and compare ----
    for s in scenarios:
        if "skipped" in results[s] or results[s].get("real_rc", 0) != 0:
            continue
        real_dir = os.path.join(a.out, "real", names[s])
        if not os.path.exists(os.path.join(real_dir, "summary.json")):
            results[s]["error"] = "no real run directory"
            continue
        hp = os.path.join(host_dir, names[s] + ".toml")
        variants = [("", hp if a.recalibrate else profile, [])]
        if a.recalibrate:
            variants.append(("_base", profile, []))
            results[s]["host"] = host_figures(hp)
        for suffix, prof, extra_args in variants:
            sim_dir = os.path.join(a.out, "sim" + suffix, names[s])
            shutil.rmtree(sim_dir, ignore_errors=True)
            rc, so, se, dt = run([a.bin, "sim", s, "--calibration", prof, "--out", sim_dir] + steps_arg + extra_args,
                                 logfile=logfile)
            if rc != 0:
                results[s]["error"] = "sim failed: " + (se or so)[-1500:]
                break
            os.makedirs(os.path.join(a.out, "compare" + suffix), exist_ok=True)
            cjson = os.path.join(a.out, "compare" + suffix, names[s] + ".json")
            rc, so, se, dt = run([a.bin, "compare", real_dir, sim_dir, "--json", cjson], logfile=logfile)
            open(os.path.join(a.out, "compare" + suffix, names[s] + ".txt"), "w").write(so + se)
            if not os.path.exists(cjson):
                results[s]["error"] = "compare failed: " + (se or so)[-1500:]
                break
            results[s]["compare" + suffix] = json.load(open(cjson))
            if suffix == "":
                probe = results[s]["compare"].get("host_probe")
                if probe:
                    # The same profile with its host costs scaled to the run's own host probe (threewalls
                    # compare: probe / profile for the same calls): what the model gives when it knows how
                    # fast this process's host was (not a prediction).
                    results[s]["host_probe"] = {"scale": probe["host_scale_for_the_run"],
                                                "probe_us": [round(v, 2) for v in probe["probe_us"]],
                                                "profile_us": [round(v, 2) for v in probe["charged_us"]]}
                    variants.append(("_probe", prof, ["--host-scale", f"{probe['host_scale_for_the_run']:.4f}"]))
                disk = disk_read_rates(real_dir, sim_dir)
                if disk:
                    # The same profile with the disk as fast as the run's own reads were (not a prediction).
                    results[s]["disk_rate"] = disk
                    variants.append(("_disk", prof, ["--disk-scale", f"{disk['scale']:.4f}"]))

    # ---- table ----
    def step_err(c):
        return c.get("step_time_us", {}).get("median_error_pct")

    def major_phase_errors(c):
        out = []
        for row in c.get("phases", []):
            if row.get("share_of_a", 0) >= 0.05 and row.get("median_error_pct") is not None:
                out.append((row["phase"], row["median_error_pct"], row["share_of_a"]))
        return out

    def mem_err(c):
        return (c.get("peak_memory_bytes") or {}).get("error_pct")

    def step_median(c, side):
        return c.get("step_time_us", {}).get(side, {}).get("median")

    lines = [f"# Fidelity on {a.kind} ({gpus} GPUs), {started}", "",
             f"Profile: `{profile}`" + (f" (calibrated in this call, {calib_seconds:.0f} s)" if calib_seconds else ""), "",
             "| scenario | GPUs | step real (ms) | step sim (ms) | step error | phases >= 5% (median abs error) | worst phase | peak memory error |"
             + (" step error, PROFILE alone | kernel launch / GEMM call / record (us); disk read 16 MiB (GB/s), just before |"
                if a.recalibrate else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if a.recalibrate else "")]
    if a.repeat > 1:
        lines[-2] += " step real, min–max of the processes' medians (processes) |"
        lines[-1] += "---|"
    probed = any("host_probe" in results[s] for s in scenarios)
    if probed:
        lines[-2] += " host probe / profile (scale) | step error, host scaled to the probe |"
        lines[-1] += "---|---|"
    disked = any("disk_rate" in results[s] for s in scenarios)
    if disked:
        lines[-2] += " disk read GB/s, run / sim (scale) | step error, disk at the run's rate |"
        lines[-1] += "---|---|"
    if a.recalibrate:
        lines[2:2] = [f"Families of `{a.recalibrate}` measured right before each real run (`--recalibrate`), "
                      "the rest from the profile.", ""]
    base_errors, probe_errors, disk_errors = [], [], []
    step_errors, phase_errors, mem_errors = [], [], []
    for s in scenarios:
        r = results[s]
        if "skipped" in r:
            lines.append(f"| {r['name']} | {r['gpus']} | skipped: {r['skipped']} | | | | | |")
            continue
        if "compare" not in r:
            err = r.get("error", "failed").replace("\n", " ").replace("|", "/")[:200]
            lines.append(f"| {r['name']} | {r['gpus']} | FAILED: {err} | | | | | |")
            continue
        c = r["compare"]
        se = step_err(c)
        majors = major_phase_errors(c)
        me = mem_err(c)
        if se is not None:
            step_errors.append(abs(se))
        pe = statistics.median([abs(e) for _, e, _ in majors]) if majors else None
        if pe is not None:
            phase_errors.append(pe)
        if me is not None:
            mem_errors.append(abs(me))
        worst = max(majors, key=lambda t: abs(t[1])) if majors else None
        real_ms = (step_median(c, "a") or 0) / 1000.0
        sim_ms = (step_median(c, "b") or 0) / 1000.0
        extra = ""
        if a.recalibrate:
            be = step_err(r["compare_base"]) if "compare_base" in r else None
            if be is not None:
                base_errors.append(abs(be))
            h = r.get("host") or {}
            extra = (f" {fmt(be)}% | " + " / ".join("n/a" if h.get(k) is None else f"{h[k]:.2f}"
                                                    for k in ("kernel_launch_us", "gemm_call_us", "record_op_us"))
                     + ("" if h.get("disk_GBps") is None else f"; {h['disk_GBps']:.2f}") + " |")
        if r.get("real_step_ms_per_process"):
            per = r["real_step_ms_per_process"]
            extra += f" {min(per):.2f}–{max(per):.2f} ({len(per)}) |"
        def variant_columns(suffix, errors, measured):
            # "measured (scale) | step error" of a diagnostic simulation variant (probe, disk)
            e = step_err(r["compare" + suffix]) if "compare" + suffix in r else None
            if e is not None:
                errors.append(abs(e))
            return " n/a | n/a |" if not measured else f" {measured} | {fmt(e)}% |"

        if probed:
            pr = r.get("host_probe")
            extra += variant_columns("_probe", probe_errors, pr and (
                f"{'/'.join(f'{v:.1f}' for v in pr['probe_us'])} / {'/'.join(f'{v:.1f}' for v in pr['profile_us'])}"
                f" ({pr['scale']:.2f})"))
        if disked:
            dr = r.get("disk_rate")
            extra += variant_columns("_disk", disk_errors,
                                     dr and f"{dr['real_GBps']:.2f} / {dr['sim_GBps']:.2f} ({dr['scale']:.3f})")
        lines.append(f"| {r['name']} | {r['gpus']} | {real_ms:.2f} | {sim_ms:.2f} | {fmt(se)}% | "
                     f"{'n/a' if pe is None else f'{pe:.1f}%'} ({len(majors)}) | "
                     f"{'' if not worst else f'{worst[0]} {worst[1]:+.1f}%'} | {fmt(me)}% |" + extra)
    lines += ["", "Errors are (simulated - measured) / measured. Summary over the compared scenarios:", ""]
    if step_errors:
        lines.append(f"* step time |error|: median {statistics.median(step_errors):.1f}%, worst {max(step_errors):.1f}% "
                     f"({len(step_errors)} scenarios)")
    if base_errors:
        lines.append(f"* step time |error| with the profile alone (no host recalibration): median "
                     f"{statistics.median(base_errors):.1f}%, worst {max(base_errors):.1f}%; within 10%: "
                     f"{sum(e <= 10 for e in base_errors)} of {len(base_errors)}")
    if step_errors:
        lines.append(f"* step time within 10%: {sum(e <= 10 for e in step_errors)} of {len(step_errors)}")
    if probe_errors:
        lines.append(f"* step time |error| with the host costs scaled to each run's own host probe (run.json "
                     f"host_probe; not a prediction): median {statistics.median(probe_errors):.1f}%, worst "
                     f"{max(probe_errors):.1f}%; within 10%: {sum(e <= 10 for e in probe_errors)} of {len(probe_errors)}")
    if disk_errors:
        lines.append(f"* step time |error| with the disk reads as fast as each run's own (expert_fetch_disk records; "
                     f"not a prediction): median {statistics.median(disk_errors):.1f}%, worst {max(disk_errors):.1f}%; "
                     f"within 10%: {sum(e <= 10 for e in disk_errors)} of {len(disk_errors)}")
    if phase_errors:
        lines.append(f"* per-phase median |error| (phases >= 5% of the step): median over scenarios "
                     f"{statistics.median(phase_errors):.1f}%, worst {max(phase_errors):.1f}%")
    if mem_errors:
        lines.append(f"* peak memory |error|: median {statistics.median(mem_errors):.1f}%, worst {max(mem_errors):.1f}%")

    # ---- speed-up pairs ----
    pairs = []
    for pf in pair_files:
        pairs += json.load(open(pf))
    if pairs:
        lines += ["", "| change | base | variant | measured speed-up | predicted speed-up | difference (points) |",
                  "|---|---|---|---|---|---|"]
        by_name = {results[s]["name"]: results[s] for s in scenarios}
        for base, var, label in pairs:
            rb, rv = by_name.get(base), by_name.get(var)
            if not rb or not rv or "compare" not in rb or "compare" not in rv:
                lines.append(f"| {label} | {base} | {var} | n/a | n/a | not run |")
                continue
            mb, mv = step_median(rb["compare"], "a"), step_median(rv["compare"], "a")
            pb, pv = step_median(rb["compare"], "b"), step_median(rv["compare"], "b")
            meas = mb / mv if mv else None
            pred = pb / pv if pv else None
            diff = None if meas is None or pred is None else 100.0 * (pred - meas)
            lines.append(f"| {label} | {base} | {var} | {meas:.3f}x | {pred:.3f}x | {fmt(diff)} |")

    md = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "fidelity.md"), "w").write(md)
    slim = {results[s]["name"]: {k: v for k, v in results[s].items() if not k.startswith("compare")} for s in scenarios}
    for s in scenarios:
        c = results[s].get("compare")
        if c:
            slim[results[s]["name"]]["step_time_error_pct"] = step_err(c)
            slim[results[s]["name"]]["real_step_ms"] = (step_median(c, "a") or 0) / 1000.0
            slim[results[s]["name"]]["sim_step_ms"] = (step_median(c, "b") or 0) / 1000.0
            slim[results[s]["name"]]["peak_memory_error_pct"] = mem_err(c)
            slim[results[s]["name"]]["major_phases"] = major_phase_errors(c)
        if results[s].get("compare_base"):
            slim[results[s]["name"]]["step_time_error_pct_profile_alone"] = step_err(results[s]["compare_base"])
        if results[s].get("compare_probe"):
            slim[results[s]["name"]]["step_time_error_pct_host_probe"] = step_err(results[s]["compare_probe"])
            slim[results[s]["name"]]["sim_step_ms_host_probe"] = (step_median(results[s]["compare_probe"], "b") or 0) / 1000.0
        if results[s].get("compare_disk"):
            slim[results[s]["name"]]["step_time_error_pct_disk_rate"] = step_err(results[s]["compare_disk"])
    json.dump(slim, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    with tarfile.open(os.path.join(a.out, "runs.tar.xz"), "w:xz") as t:
        # Of the repeated processes only the summaries: the compared one is in real/ whole.
        def summaries_only(info):
            keep = info.isdir() or os.path.basename(info.name) in ("summary.json", "run.json")
            return info if keep else None

        for d in ("real", "sim", "compare", "logs", "sim_base", "compare_base", "sim_probe", "compare_probe", "sim_disk",
                  "compare_disk", "host_profiles",
                  "real_repeats"):
            if os.path.exists(os.path.join(a.out, d)):
                t.add(os.path.join(a.out, d), arcname=d, filter=summaries_only if d == "real_repeats" else None)
    log(md)


if __name__ == "__main__":
    main()
