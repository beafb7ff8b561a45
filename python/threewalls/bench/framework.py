"""PyTorch's host costs that the simulator charges for a scenario with run.framework = "pytorch_eager".

    python3 -m threewalls.bench.framework --out DIR [--profile PROFILE.toml] [--device cuda|cpu]

Each figure is the host time per operation, the median over --repeats repeats of --ops operations,
timed with time.perf_counter_ns on the thread that issues them:

* `eager_op_us`: a one-element `torch.add(a, b, out=c)` issued while the device is held busy by a
  long kernel queued first (torch.cuda._sleep), so no launch waits for the device: Python, the
  dispatcher and one kernel launch. host.framework_op is this less the profile's host.kernel_launch
  (the C++ launch that threewalls run pays and the simulator already charges).
* `autograd_node_us`: the backward of a chain of --ops one-element multiplications, per node: the
  autograd engine's per-node cost with its kernel launch (the device held busy again).
* `autograd_extra_us`: autograd_node_us less eager_op_us: what a backward op costs beyond a forward op.
* `item_us`: `.item()` of a one-element tensor whose producer is done (an idle device): a
  device-to-host read that blocks the host, PyTorch's side of host.gpu_read.
* `nonzero_us`: `torch.nonzero` of a 64-element mask on an idle device (it synchronises to size its
  output), the per-expert read of an eager MoE loop that gathers tokens with a mask.
* `stream_switch_us`: per op, issuing each op under `with torch.cuda.stream(s)` rotating over 4
  streams, less issuing them on one stream (host.stream_cycle's counterpart in PyTorch).

Writes DIR/framework.json (every figure, device, torch) and, with --profile, DIR/framework_families.toml:
a copy of that profile whose host.framework_op family holds the measured point, in the profile's
TOML form with a note saying how it was measured; `threewalls_merge_families PROFILE
DIR/framework_families.toml OUT.toml host.framework_op` refits it into a profile (the C++ profile
writer; scripts/python_gpu_checks.sh does). On a CPU (--device cpu) the device-only figures are null
and the rest are CPU timings: a smoke test of the plumbing, not a calibration.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tomllib
from typing import Callable, Dict, List, Optional

import torch

from threewalls.bench.profile_text import replace_family

FAMILY = "host.framework_op"


def _median_per_op(fn: Callable[[], None], ops: int, repeats: int, before: Optional[Callable[[], None]] = None,
                   after: Optional[Callable[[], None]] = None) -> Dict[str, float]:
    """Host microseconds per op of fn() run `ops` times, per repeat; median, p10, p90 over repeats."""
    per = []
    for _ in range(repeats):
        if before:
            before()
        t0 = time.perf_counter_ns()
        for _ in range(ops):
            fn()
        t1 = time.perf_counter_ns()
        if after:
            after()
        per.append((t1 - t0) / 1000.0 / ops)
    return _stats(per, ops)


def _stats(per: List[float], ops: int) -> Dict[str, float]:
    """Median, p10 and p90 of per-repeat figures."""
    per = sorted(per)
    q = statistics.quantiles(per, n=10) if len(per) >= 2 else [per[0]] * 9
    return {"median_us": statistics.median(per), "p10_us": q[0], "p90_us": q[-1], "repeats": len(per), "ops": ops}


def measure(device: str, ops: int, repeats: int) -> Dict[str, object]:
    cuda = device == "cuda"
    dev = torch.device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def busy():
        """Queue a kernel long enough to cover the timed launches (about 20 us a launch)."""
        if cuda:
            sync()
            torch.cuda._sleep(int(ops * 20e-6 * 2e9))  # cycles at about 2 GHz

    a = torch.ones(1, device=dev)
    b = torch.ones(1, device=dev)
    c = torch.empty(1, device=dev)
    for _ in range(50):
        torch.add(a, b, out=c)
    sync()
    out: Dict[str, object] = {}
    out["eager_op_us"] = _median_per_op(lambda: torch.add(a, b, out=c), ops, repeats, busy, sync)

    x = torch.ones(1, device=dev, requires_grad=True)

    def chain():
        y = x
        for _ in range(ops):
            y = y * 1.0001
        return y

    ys: List[torch.Tensor] = []

    def build():
        busy()
        ys.clear()
        ys.append(chain())
        if cuda:
            sync()
            torch.cuda._sleep(int(ops * 40e-6 * 2e9))

    per = []
    for _ in range(repeats):
        build()
        t0 = time.perf_counter_ns()
        ys[0].backward()
        t1 = time.perf_counter_ns()
        sync()
        x.grad = None
        per.append((t1 - t0) / 1000.0 / ops)
    out["autograd_node_us"] = _stats(per, ops)
    out["autograd_extra_us"] = out["autograd_node_us"]["median_us"] - out["eager_op_us"]["median_us"]
    if cuda:
        t = torch.ones(1, device=dev)
        out["item_us"] = _median_per_op(lambda: t.item(), max(1, ops // 10), repeats, sync)
        mask = torch.arange(64, device=dev) % 3 == 0
        out["nonzero_us"] = _median_per_op(lambda: torch.nonzero(mask), max(1, ops // 10), repeats, sync, sync)
        streams = [torch.cuda.Stream() for _ in range(4)]
        cur = [0]

        def switched():
            s = streams[cur[0]]
            cur[0] = (cur[0] + 1) % len(streams)
            with torch.cuda.stream(s):
                torch.add(a, b, out=c)

        def one_stream():
            with torch.cuda.stream(streams[0]):
                torch.add(a, b, out=c)

        rot = _median_per_op(switched, ops, repeats, busy, sync)
        same = _median_per_op(one_stream, ops, repeats, busy, sync)
        out["stream_switch_us"] = rot["median_us"] - same["median_us"]
    else:
        out["item_us"] = out["nonzero_us"] = out["stream_switch_us"] = None
    return out


def _kernel_launch_s(profile_text: str, path: str) -> float:
    doc = tomllib.loads(profile_text)
    try:
        return float(doc["host"]["kernel_launch"]["fit"]["value_s"])
    except (KeyError, TypeError, ValueError):
        raise SystemExit(f"{path}: no [host.kernel_launch.fit] value_s: not a threewalls calibration profile") from None


def families_toml(profile_text: str, path: str, eager_op: Dict[str, float], note: str) -> str:
    """`profile_text` with its [host.framework_op] and [host.framework_op.fit] tables replaced by one
    measured point: eager_op less the profile's host.kernel_launch."""
    launch_us = _kernel_launch_s(profile_text, path) * 1e6
    vals = {k: max(eager_op[k] - launch_us, 0.01) * 1e-6 for k in ("median_us", "p10_us", "p90_us")}
    block = (f"[{FAMILY}]\nmodel = \"median_v1\"\nnote = {json.dumps(note)}\npoints = [\n"
             f"  {{ median_s = {vals['median_us']:.6g}, p10_s = {vals['p10_us']:.6g}, p90_s = {vals['p90_us']:.6g}, "
             f"count = {int(eager_op['repeats'])} }},\n]\n\n"
             f"[{FAMILY}.fit]\nvalue_s = {vals['median_us']:.6g}\nrel_err_median = 0.0\nrel_err_max = 0.0\n"
             f"loo_rel_err_median = nan\nloo_rel_err_max = nan\nloo_points = 0\n")
    return replace_family(profile_text, path, FAMILY, block)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m threewalls.bench.framework", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", help="calibration profile whose host.kernel_launch the framework op is measured "
                                      "against; writes framework_families.toml from it")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch.cuda is not available", file=sys.stderr)
        return 2
    if args.ops < 1 or args.repeats < 1:
        print("--ops and --repeats must be >= 1", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    res = measure(device, args.ops, args.repeats)
    name = torch.cuda.get_device_name() if device == "cuda" else "host CPU"
    report = {"device": name, "torch": torch.__version__, "python": sys.version.split()[0], "ops": args.ops,
              "repeats": args.repeats, "figures": res}
    if args.profile:
        with open(args.profile, encoding="utf-8") as f:
            text = f.read()
        launch_us = _kernel_launch_s(text, args.profile) * 1e6
        smoke = " (a CPU: a smoke test of the plumbing, not a calibration)" if device == "cpu" else ""
        note = (f"measured: python3 -m threewalls.bench.framework on {name}{smoke} (torch {torch.__version__}): host time of a "
                f"one-element eager torch.add with the device busy, median of {args.repeats} x {args.ops} ops, "
                f"{res['eager_op_us']['median_us']:.2f} us, less this profile's host.kernel_launch {launch_us:.2f} us")
        path = os.path.join(args.out, "framework_families.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(families_toml(text, args.profile, res["eager_op_us"], note))
        report["framework_op_us"] = max(res["eager_op_us"]["median_us"] - launch_us, 0.01)
        report["profile"] = args.profile
        report["families"] = path
    with open(os.path.join(args.out, "framework.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    for k, v in res.items():
        v = v["median_us"] if isinstance(v, dict) else v
        print(f"{k:20s} {'n/a' if v is None else f'{v:.2f} us'}")
    if "framework_op_us" in report:
        print(f"{'host.framework_op':20s} {report['framework_op_us']:.2f} us -> {report['families']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
