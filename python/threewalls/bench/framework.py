"""PyTorch's host costs that the simulator charges for a scenario with run.framework = "pytorch_eager".

    python3 -m threewalls.bench.framework --out DIR [--profile PROFILE.toml] [--device cuda|cpu]

Each figure is the host time per operation, the median over --repeats repeats of --ops operations,
timed with time.perf_counter_ns on the thread that issues them. Launches timed behind a blocking
kernel go in batches of at most 256, each behind its own: CUDA holds about a thousand pending
launches, past which a launch waits for the device (a longer batch would time the blocking kernel).

* `eager_op_us`: a one-element `torch.add(a, b, out=c)` issued while the device is held busy by a
  long kernel queued first (torch.cuda._sleep), so no launch waits for the device: Python, the
  dispatcher and one kernel launch. host.framework_op is this less the profile's host.kernel_launch
  (the C++ launch that threewalls run pays and the simulator already charges).
* `autograd_op_us`: one-element-row ops that record an autograd node (index_select, silu, mul and add
  of a [8, 64] tensor that requires grad, in rotation), the device busy as for eager_op_us: a
  training step's forward op. host.framework_autograd_op is this less the profile's
  host.kernel_launch: what the simulator charges per forward launch of a training step in place of
  host.framework_op.
* `autograd_node_us`: the backward of a chain of min(--ops, 256) one-element multiplications, per node (one
  kernel each): the autograd engine's per-node cost, the C++ dispatch of the node's op and its
  kernel launch (the device held busy again). host.framework_backward_op is this less the profile's
  host.kernel_launch: what the simulator charges per backward launch in place of host.framework_op.
* `autograd_extra_us`: autograd_node_us less eager_op_us: what a backward op costs beyond a forward op
  (negative when the engine's C++ path is cheaper than a Python op).
* `autograd_linear_us`: the backward of a chain of min(--ops, 256) / 2 tiny F.linear layers (x [1, 8], leaf
  weights [8, 8]; MmBackward0's two products, the transpose's node and the weight's AccumulateGrad),
  per backward launch (two per layer): reported beside autograd_node_us, not fitted (a backward GEMM's
  launch is the profile's library-call cost).
* `where_us`: `torch.where` of one expert's slice of a one-hot routing mask ([64 experts, 8, 64] int64)
  on an idle device: the per-expert device-to-host read of a Hugging Face eager MoE loop (the
  nonzero kernel's launch, the wait, the read of the count, the index tensors). host.framework_sync
  is this figure: the simulator charges it for every device-to-host read of a pytorch_eager step in
  place of host.gpu_read (its wait for the device is the read's dependency).
* `item_us`: `.item()` of a one-element tensor whose producer is done (an idle device): a
  device-to-host read that blocks the host, PyTorch's side of host.gpu_read.
* `nonzero_us`: `torch.nonzero` of a 64-element mask on an idle device (it synchronises to size its
  output).
* `attention_plan_us`: `F.scaled_dot_product_attention` at a decode shape (one query per sequence;
  batch 16, 16 heads of 128 or 32 heads over 4 KV groups) with a key length the process has not run,
  on an idle device: the host time of that first call less the median of the next calls at the same
  length. PyTorch's default backend there (cuDNN) builds and caches an execution plan per shape:
  host.framework_attention_plan, which the simulator charges for the first attention of each new
  shape of a pytorch_eager inference step (docs/simulator.md, "Framework host"). CUDA only.
* `stream_switch_us`: per op, issuing each op under `with torch.cuda.stream(s)` rotating over 4
  streams, less issuing them on one stream (the context switch alone; reported, not fitted).
* `stream_op_us` (per N in --stream-counts): an eager expert loop, forward with autograd and backward,
  with the experts on N streams against the same loop on one stream, the device held busy: the extra
  host time per StepGraph op of the loop. The loop is the runner's (threewalls.runner.kernels:
  ExpertStreams, expert_gather, linear, act, expert_weights, expert_scatter) over 8 experts of 16 token
  rows (hidden 64, GELU MLP of 128): 12 StepGraph ops per expert (gather, fc1, act, fc2, scatter and
  the backward's scatter, fc2 dgrad and wgrad, act, fc1 dgrad and wgrad, gather). What it holds:
  PyTorch's side-stream dispatch, the allocator's record_stream events and their queries, and the
  autograd engine's cross-stream synchronisation in the backward. Each repeat times both loops
  (paired); the figure is the median of the per-repeat differences. host.framework_stream_op, which
  the simulator charges per expert-loop launch of a pytorch_eager step whose experts rotate over N
  streams. CUDA only.
* `record_op_us`: the reference runner's recording, per StepGraph op: a chain of 32 of its
  elementwise ops (threewalls.runner.ops.Op: the phase's CUDA events, the backward box and its
  marks) and 32 of its linears (ops.linear: a Python autograd function with a phase per product),
  forward and backward, on a step the profiler records less the same chain on the next step, which
  it does not, the device busy; paired per repeat, divided by the chain's StepGraph ops (2 per
  elementwise op, 3 per linear). host.framework_record_op, which the simulator charges per timed op
  of a recorded pytorch_eager step in place of host.record_op.

Writes DIR/framework.json (every figure, device, torch) and, with --profile, DIR/framework_families.toml:
a copy of that profile whose families host.framework_op, host.framework_backward_op,
host.framework_sync, host.framework_autograd_op, host.framework_record_op (and, on CUDA,
host.framework_attention_plan and host.framework_stream_op) hold the measured points (replaced where
the profile has them, appended where not), in the profile's TOML form with a note saying how each was
measured. The measurement needs no threewalls binary; `threewalls_merge_families PROFILE
DIR/framework_families.toml OUT.toml FAMILY...` (the command it prints) refits them into a profile
(the C++ profile writer; scripts/python_gpu_checks.sh does). On a CPU (--device cpu) the device-only figures
are null and the rest are CPU timings: a smoke test of the plumbing, not a calibration.
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
import torch.nn.functional as F

from threewalls.bench.spread import p10_median_p90
from threewalls.bench.profile_text import replace_family, replace_or_add_family

FAMILY = "host.framework_op"
BACKWARD_FAMILY = "host.framework_backward_op"
SYNC_FAMILY = "host.framework_sync"
ATTENTION_PLAN_FAMILY = "host.framework_attention_plan"
AUTOGRAD_FAMILY = "host.framework_autograd_op"
STREAM_FAMILY = "host.framework_stream_op"
RECORD_FAMILY = "host.framework_record_op"
# And, where measured (CUDA): ATTENTION_PLAN_FAMILY, STREAM_FAMILY.
FAMILIES = (FAMILY, BACKWARD_FAMILY, SYNC_FAMILY, AUTOGRAD_FAMILY, RECORD_FAMILY)
# The families' headings in a profile (calibration/src/families/host.cpp), for a profile without them.
_HEADINGS = {
    BACKWARD_FAMILY: "host time per backward op of an eager framework on top of the kernel launch (its autograd "
                     "engine's node and the C++ dispatch), in place of host.framework_op: t = median of the points",
    SYNC_FAMILY: "host time of an eager framework's device-to-host read on an idle device (PyTorch: torch.where / "
                 "nonzero of a boolean mask: its dispatch, launch, wait and read), in place of host.gpu_read: t = "
                 "median of the points",
    AUTOGRAD_FAMILY: "extra host time per forward op of an eager framework that records it for autograd (a training "
                     "step's forward: the node, its saved tensors), on top of the kernel launch, in place of "
                     "host.framework_op: t = median of the points",
    RECORD_FAMILY: "extra host time per timed op of an eager framework's recorded step (the reference runner's "
                   "phases: CUDA events, backward marks, Python autograd functions), forward and backward alike, "
                   "over the same op unrecorded, in place of host.record_op: t = median of the points",
    STREAM_FAMILY: "extra host time per launch of an eager framework's expert loop whose experts rotate over N "
                   "streams (PyTorch: side-stream dispatch, allocator stream events, the autograd engine's "
                   "cross-stream synchronisation), over the same loop on one stream: median per N, "
                   "log2-interpolated from extra(1) = 0",
    ATTENTION_PLAN_FAMILY: "host time an eager framework spends before its fused attention's first call at a shape "
                           "it has not run (PyTorch's cuDNN SDPA builds and caches an execution plan per shape), on "
                           "top of the call: t = median of the points",
}


def attention_plan(repeats: int) -> Dict[str, float]:
    """Host time of SDPA's first call at a key length new to the process, less the next calls' (CUDA)."""
    dev = torch.device("cuda")
    per: List[float] = []
    # cuDNN's initialisation (the process's first attention) is not a plan: one call at a shape of its own first.
    w = torch.randn(1, 1, 8, 64, device=dev, dtype=torch.bfloat16)
    F.scaled_dot_product_attention(w, w, w)
    for i in range(repeats):
        h, g = (16, 16) if i % 2 == 0 else (32, 4)
        length = 517 + 29 * i  # a new length each time, none a scenario's
        q = torch.randn(16, h, 1, 128, device=dev, dtype=torch.bfloat16)
        k = torch.randn(16, g, length, 128, device=dev, dtype=torch.bfloat16)
        v = torch.randn(16, g, length, 128, device=dev, dtype=torch.bfloat16)

        def call():
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=h != g)
            torch.cuda.synchronize()
            return (time.perf_counter_ns() - t0) / 1e3

        first = call()
        warm = statistics.median(call() for _ in range(5))
        per.append(max(first - warm, 0.01))
    return _stats(per, 1)


# The stream figure's expert loop: experts, token rows per expert, hidden and MLP width, and the
# StepGraph ops one expert of it stands for (5 forward, 7 backward; docs/stepgraph.md).
STREAM_EXPERTS, STREAM_ROWS, STREAM_HIDDEN, STREAM_FFN = 8, 16, 64, 128
STREAM_OPS_PER_EXPERT = 12


def stream_ops(counts: List[int], repeats: int) -> Dict[str, Dict[str, float]]:
    """Extra host microseconds per StepGraph op of an eager expert loop (forward with autograd and
    backward) on N streams over the same loop on one stream, per N in counts (CUDA)."""
    from threewalls.runner import kernels
    dev = torch.device("cuda")
    e_n, t = STREAM_EXPERTS, STREAM_EXPERTS * STREAM_ROWS
    x = torch.randn(t, STREAM_HIDDEN, device=dev, requires_grad=True)
    weights = torch.rand(t, 1, device=dev, requires_grad=True)
    rows = [torch.arange(e, t, e_n, device=dev) for e in range(e_n)]  # top-1, balanced; no host read
    slot = [torch.zeros_like(r) for r in rows]
    mlp = [(torch.randn(STREAM_FFN, STREAM_HIDDEN, device=dev, requires_grad=True),
            torch.randn(STREAM_HIDDEN, STREAM_FFN, device=dev, requires_grad=True)) for _ in range(e_n)]
    leaves = [x, weights] + [w for pair in mlp for w in pair]
    side = [torch.cuda.Stream() for _ in range(max(counts) - 1)]

    def loop(n: int) -> float:
        """Host microseconds of one forward and backward of the loop on n streams, the device busy."""
        es = kernels.ExpertStreams([torch.cuda.current_stream()] + side[:n - 1] if n > 1 else [])
        torch.cuda.synchronize()
        torch.cuda._sleep(int(e_n * STREAM_OPS_PER_EXPERT * 3 * 40e-6 * 2e9))  # ~40 us per launch, 3 per op
        t0 = time.perf_counter_ns()
        out = x.new_zeros(t, STREAM_HIDDEN)
        es.fork()
        for e in range(e_n):
            with es.on(e):
                es.use(e, x, rows[e], out)
                w1, w2 = mlp[e]
                ye = kernels.linear(kernels.act(kernels.linear(kernels.expert_gather(x, rows[e]), w1), False), w2)
                out = kernels.expert_scatter(out, rows[e], ye, kernels.expert_weights(weights, rows[e], slot[e]))
        es.join()
        out.sum().backward()
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        for leaf in leaves:
            leaf.grad = None
        return (t1 - t0) / 1e3

    for n in [1] + counts:  # warm-up: kernels, allocator pools per stream
        for _ in range(3):
            loop(n)
    out: Dict[str, Dict[str, float]] = {}
    for n in counts:
        per = []
        for _ in range(repeats):
            one, many = loop(1), loop(n)
            per.append(max((many - one) / (e_n * STREAM_OPS_PER_EXPERT), 0.01))
        out[str(n)] = _stats(per, e_n * STREAM_OPS_PER_EXPERT)
    return out


# The recording figure's chain: the runner's elementwise ops and linears, each this many, and the
# StepGraph ops each stands for (forward and backward; a linear's backward is two products).
RECORD_CHAIN, RECORD_EW_OPS, RECORD_LINEAR_OPS = 32, 2, 3


def record_ops(device: str, repeats: int) -> Dict[str, float]:
    """Extra host microseconds per StepGraph op of the reference runner's recording (a step the
    profiler records against the next one, which it does not), forward and backward, the device busy."""
    import tempfile
    from threewalls.profiler import Profiler, SamplingConfig
    from threewalls.runner import ops as rops
    dev = torch.device(device)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    x0 = torch.randn(8, 64, device=dev, requires_grad=True)
    ws = [(torch.randn(64, 64, device=dev) * 0.125).requires_grad_() for _ in range(RECORD_CHAIN)]
    n_ops = RECORD_CHAIN * (RECORD_EW_OPS + RECORD_LINEAR_OPS)
    with tempfile.TemporaryDirectory() as d:
        with Profiler(os.path.join(d, "run"), sampling=SamplingConfig(record_every_n_steps=2, flush_every_n_steps=2),
                      use_cuda=cuda, scenario={"name": "record_ops", "path": "", "hash": ""}, nvtx="off") as prof:
            c = rops.Ctx(prof, 0)
            c.layer, c.mb = 0, 0

            def step(k: int, recorded: bool) -> float:
                prof.begin_step(k)
                if prof.recording != recorded:
                    raise RuntimeError(f"record_ops: step {k} recorded={prof.recording}, expected {recorded}")
                sync()
                if cuda:
                    torch.cuda._sleep(int(n_ops * 150e-6 * 2e9))  # ~150 us per recorded op at ~2 GHz
                t0 = time.perf_counter_ns()
                y = x0
                for w in ws:
                    with rops.Op(c, "bench_ew", [y], wall="memory") as op:
                        (yi,) = op.inputs
                        y = op.out(yi * 1.0001)
                    y = rops.linear(c, "bench_linear", y, w)
                y.sum().backward()
                t1 = time.perf_counter_ns()
                prof.end_step()
                sync()
                for leaf in [x0] + ws:
                    leaf.grad = None
                return (t1 - t0) / 1e3

            for k in range(4):  # warm-up
                step(k, k % 2 == 0)
            per = []
            for r in range(repeats):
                k = 4 + 2 * r
                rec, plain = step(k, True), step(k + 1, False)
                per.append(max((rec - plain) / n_ops, 0.01))
    return _stats(per, n_ops)


# Launches timed behind one blocking kernel: well under CUDA's limit of pending launches (about a
# thousand), past which a launch waits for the device and the timing would measure the blocking
# kernel, not the host.
BATCH = 256


def _median_per_op(fn: Callable[[], None], ops: int, repeats: int,
                   before: Optional[Callable[[int], None]] = None,
                   after: Optional[Callable[[], None]] = None) -> Dict[str, float]:
    """Host microseconds per op of fn() run `ops` times, per repeat; median, p10, p90 over repeats.
    The ops run in batches of at most BATCH, before(n) ahead of each batch of n (untimed), after()
    behind it."""
    per = []
    for _ in range(repeats):
        total = 0
        done = 0
        while done < ops:
            n = min(BATCH, ops - done)
            if before:
                before(n)
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            t1 = time.perf_counter_ns()
            if after:
                after()
            total += t1 - t0
            done += n
        per.append(total / 1000.0 / ops)
    return _stats(per, ops)


def _stats(per: List[float], ops: int) -> Dict[str, float]:
    """Median, p10 and p90 of per-repeat figures."""
    p10, med, p90 = p10_median_p90(per)
    return {"median_us": med, "p10_us": p10, "p90_us": p90, "repeats": len(per), "ops": ops}


def _backward_per_launch(chain: Callable[[], tuple], ops: int, launches: int, repeats: int, cuda: bool,
                         sync: Callable[[], None]) -> Dict[str, float]:
    """Host microseconds per kernel launch of the backward of chain() (its output and the leaves whose
    gradients to drop), timed while a kernel queued first keeps the device busy."""
    per = []
    for r in range(repeats + 1):  # the first one warms up, untimed
        sync()
        y, leaves = chain()
        if cuda:
            sync()
            torch.cuda._sleep(int(launches * 40e-6 * 2e9))  # about 40 us a launch at about 2 GHz
        t0 = time.perf_counter_ns()
        y.backward()
        t1 = time.perf_counter_ns()
        sync()
        for leaf in leaves:
            leaf.grad = None
        del y
        if r > 0:
            per.append((t1 - t0) / 1000.0 / launches)
    return _stats(per, ops)


def eager_op(device: str, ops: int, repeats: int) -> Dict[str, float]:
    """eager_op_us: host microseconds per one-element torch.add(a, b, out=c) issued while a kernel
    queued first keeps the device busy (median, p10, p90 over `repeats` of `ops`). The figure behind
    host.framework_op, and a PyTorch run's host probe (threewalls.runner: run.json
    settings.executor.device.host_probe.torch_eager_op_us)."""
    busy, sync = _busy_and_sync(device)
    dev = torch.device(device)
    a = torch.ones(1, device=dev)
    b = torch.ones(1, device=dev)
    c = torch.empty(1, device=dev)
    for _ in range(50):
        torch.add(a, b, out=c)
    sync()
    return _median_per_op(lambda: torch.add(a, b, out=c), ops, repeats, busy, sync)


def _busy_and_sync(device: str):
    """busy(n): queue a kernel long enough to cover n timed launches (40 us a launch, at most BATCH of
    them; nothing on the CPU); sync(): wait for the device."""
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def busy(n: int):
        if cuda:
            sync()
            torch.cuda._sleep(int(n * 40e-6 * 2e9))  # cycles at about 2 GHz

    return busy, sync


def measure(device: str, ops: int, repeats: int, stream_counts: Optional[List[int]] = None) -> Dict[str, object]:
    cuda = device == "cuda"
    dev = torch.device(device)
    busy, sync = _busy_and_sync(device)

    def idle(_n: int):
        sync()

    a = torch.ones(1, device=dev)
    b = torch.ones(1, device=dev)
    c = torch.empty(1, device=dev)
    out: Dict[str, object] = {}
    out["eager_op_us"] = eager_op(device, ops, repeats)

    xa = torch.randn(8, 64, device=dev, requires_grad=True)
    ia = torch.arange(8, device=dev)
    recorded = [lambda: xa.index_select(0, ia), lambda: F.silu(xa), lambda: xa * xa, lambda: xa + xa]
    turn = [0]

    def autograd_op():
        recorded[turn[0]]()
        turn[0] = (turn[0] + 1) % len(recorded)

    out["autograd_op_us"] = _median_per_op(autograd_op, ops, repeats, busy, sync)

    x = torch.ones(1, device=dev, requires_grad=True)

    nodes = min(ops, BATCH)  # one launch per node behind one blocking kernel

    def mul_chain():
        y = x
        for _ in range(nodes):
            y = y * 1.0001
        return y, [x]

    out["autograd_node_us"] = _backward_per_launch(mul_chain, nodes, nodes, repeats, cuda, sync)
    out["autograd_extra_us"] = out["autograd_node_us"]["median_us"] - out["eager_op_us"]["median_us"]
    xl = torch.ones(1, 8, device=dev, requires_grad=True)
    layers = max(1, nodes // 2)  # two launches per layer
    ws = [torch.full((8, 8), 0.125, device=dev, requires_grad=True) for _ in range(layers)]

    def linear_chain():
        y = xl
        for w in ws:
            y = F.linear(y, w)
        return y.sum(), [xl] + ws

    out["autograd_linear_us"] = _backward_per_launch(linear_chain, layers, 2 * layers, repeats, cuda, sync)
    # One-hot routing mask [experts, k, tokens] (Hugging Face's expert_mask), one expert's slice.
    idx = (torch.arange(64 * 8, device=dev) % 64).view(64, 8)
    mask = F.one_hot(idx, num_classes=64).permute(2, 1, 0)
    cur = [0]

    def where():
        torch.where(mask[cur[0]])
        cur[0] = (cur[0] + 1) % 64

    out["where_us"] = _median_per_op(where, max(1, ops // 10), repeats, idle, sync)
    out["record_op_us"] = record_ops(device, repeats)
    if cuda:
        t = torch.ones(1, device=dev)
        out["item_us"] = _median_per_op(lambda: t.item(), max(1, ops // 10), repeats, idle)
        mask = torch.arange(64, device=dev) % 3 == 0
        out["nonzero_us"] = _median_per_op(lambda: torch.nonzero(mask), max(1, ops // 10), repeats, idle, sync)
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
        out["attention_plan_us"] = attention_plan(max(4, min(repeats, 12)))
        out["stream_op_us"] = stream_ops(stream_counts or [2, 4, 8], max(repeats, 15))
    else:
        out["item_us"] = out["nonzero_us"] = out["stream_switch_us"] = out["attention_plan_us"] = None
        out["stream_op_us"] = None
    return out


def _block(family: str, note: str, points: List[Dict[str, float]], value_us: float) -> str:
    """A median_v1 family's TOML tables: its points (seconds) and the fit (their median)."""
    rows = "".join(f"  {{ median_s = {p['median_us'] * 1e-6:.6g}, p10_s = {p['p10_us'] * 1e-6:.6g}, "
                   f"p90_s = {p['p90_us'] * 1e-6:.6g}, count = {int(p['repeats'])} }},\n" for p in points)
    return (f"[{family}]\nmodel = \"median_v1\"\nnote = {json.dumps(note)}\npoints = [\n{rows}]\n\n"
            f"[{family}.fit]\nvalue_s = {value_us * 1e-6:.6g}\nrel_err_median = 0.0\nrel_err_max = 0.0\n"
            f"loo_rel_err_median = nan\nloo_rel_err_max = nan\nloo_points = 0\n")


def _stream_block(family: str, note: str, per_n: Dict[str, Dict[str, float]]) -> str:
    """A stream_cycle_v1 family's TOML tables: a point per stream count (seconds) and the fit (the
    medians per count)."""
    ns = sorted(per_n, key=int)
    extra = ", ".join(f"{per_n[n]['median_us'] * 1e-6:.6g}" for n in ns)
    rows = "".join(f"  {{ streams = {n}, median_s = {per_n[n]['median_us'] * 1e-6:.6g}, "
                   f"p10_s = {per_n[n]['p10_us'] * 1e-6:.6g}, p90_s = {per_n[n]['p90_us'] * 1e-6:.6g}, "
                   f"count = {int(per_n[n]['repeats'])} }},\n" for n in ns)
    return (f"[{family}]\nmodel = \"stream_cycle_v1\"\nnote = {json.dumps(note)}\npoints = [\n{rows}]\n\n"
            f"[{family}.fit]\nstreams = [{', '.join(ns)}]\n"
            f"extra_s = [{extra}]\n"
            f"rel_err_median = 0.0\nrel_err_max = 0.0\n"
            f"loo_rel_err_median = nan\nloo_rel_err_max = nan\nloo_points = 0\n")


def _less(fig: Dict[str, float], launch_us: float) -> Dict[str, float]:
    """A figure less a launch, each statistic floored at 0.01 us (a family's value must be > 0)."""
    out = dict(fig)
    for k in ("median_us", "p10_us", "p90_us"):
        out[k] = max(fig[k] - launch_us, 0.01)
    return out


def _kernel_launch_s(profile_text: str, path: str) -> float:
    doc = tomllib.loads(profile_text)
    try:
        return float(doc["host"]["kernel_launch"]["fit"]["value_s"])
    except (KeyError, TypeError, ValueError):
        raise SystemExit(f"{path}: no [host.kernel_launch.fit] value_s: not a threewalls calibration profile") from None


def families_toml(profile_text: str, path: str, figures: Dict[str, object], notes: Dict[str, str]) -> str:
    """`profile_text` with host.framework_op (eager_op_us less the profile's host.kernel_launch),
    host.framework_backward_op (autograd_node_us less it) and host.framework_sync (where_us), one
    measured point each, replacing the profile's tables of those families or appended after them.
    `notes`: each family's note. A profile without host.framework_op is refused (SystemExit)."""
    launch_us = _kernel_launch_s(profile_text, path) * 1e6
    op = _less(figures["eager_op_us"], launch_us)
    bwd = _less(figures["autograd_node_us"], launch_us)
    rec = _less(figures["autograd_op_us"], launch_us)
    record = figures["record_op_us"]
    sync = figures["where_us"]
    plan = figures.get("attention_plan_us")
    text = replace_family(profile_text, path, FAMILY, _block(FAMILY, notes[FAMILY], [op], op["median_us"]))
    text = replace_or_add_family(text, path, AUTOGRAD_FAMILY,
                                 _block(AUTOGRAD_FAMILY, notes[AUTOGRAD_FAMILY], [rec], rec["median_us"]),
                                 _HEADINGS[AUTOGRAD_FAMILY])
    if plan is not None:
        text = replace_or_add_family(text, path, ATTENTION_PLAN_FAMILY,
                                     _block(ATTENTION_PLAN_FAMILY, notes[ATTENTION_PLAN_FAMILY], [plan],
                                            plan["median_us"]), _HEADINGS[ATTENTION_PLAN_FAMILY])
    text = replace_or_add_family(text, path, RECORD_FAMILY,
                                 _block(RECORD_FAMILY, notes[RECORD_FAMILY], [record], record["median_us"]),
                                 _HEADINGS[RECORD_FAMILY])
    streams = figures.get("stream_op_us")
    if streams:
        text = replace_or_add_family(text, path, STREAM_FAMILY,
                                     _stream_block(STREAM_FAMILY, notes[STREAM_FAMILY], streams),
                                     _HEADINGS[STREAM_FAMILY])
    text = replace_or_add_family(text, path, BACKWARD_FAMILY,
                                 _block(BACKWARD_FAMILY, notes[BACKWARD_FAMILY], [bwd], bwd["median_us"]),
                                 _HEADINGS[BACKWARD_FAMILY])
    return replace_or_add_family(text, path, SYNC_FAMILY,
                                 _block(SYNC_FAMILY, notes[SYNC_FAMILY], [sync], sync["median_us"]),
                                 _HEADINGS[SYNC_FAMILY])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m threewalls.bench.framework", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", help="calibration profile whose host.kernel_launch the framework op is measured "
                                      "against; writes framework_families.toml from it")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--stream-counts", default="2,4,8",
                    help="stream counts of the expert-loop stream figure, comma-separated, each >= 2 (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        counts = sorted({int(v) for v in args.stream_counts.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 2 or counts[-1] > 64:
        print(f"--stream-counts {args.stream_counts!r}: comma-separated integers from 2 to 64", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch.cuda is not available", file=sys.stderr)
        return 2
    if args.ops < 1 or args.repeats < 1:
        print("--ops and --repeats must be >= 1", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    res = measure(device, args.ops, args.repeats, counts)
    name = torch.cuda.get_device_name() if device == "cuda" else "host CPU"
    report = {"device": name, "torch": torch.__version__, "python": sys.version.split()[0], "ops": args.ops,
              "repeats": args.repeats, "figures": res}
    if args.profile:
        with open(args.profile, encoding="utf-8") as f:
            text = f.read()
        launch_us = _kernel_launch_s(text, args.profile) * 1e6
        smoke = " (a CPU: a smoke test of the plumbing, not a calibration)" if device == "cpu" else ""
        how = f"measured: python3 -m threewalls.bench.framework on {name}{smoke} (torch {torch.__version__}): "
        notes = {
            FAMILY: how + (f"host time of a one-element eager torch.add with the device busy (batches of {BATCH}), "
                           f"median of {args.repeats} x {args.ops} ops, {res['eager_op_us']['median_us']:.2f} us, less this profile's "
                           f"host.kernel_launch {launch_us:.2f} us"),
            BACKWARD_FAMILY: how + (f"host time per node of the backward of a chain of "
                                    f"{res['autograd_node_us']['ops']} one-element "
                                    f"multiplications with the device busy, median of {args.repeats} repeats, "
                                    f"{res['autograd_node_us']['median_us']:.2f} us, less this profile's "
                                    f"host.kernel_launch {launch_us:.2f} us (a chain of tiny F.linear layers: "
                                    f"{res['autograd_linear_us']['median_us']:.2f} us per backward launch)"),
            AUTOGRAD_FAMILY: how + (f"host time of one-element-row index_select, silu, mul and add (in rotation) "
                                    f"recording autograd nodes, with the device busy, median of {args.repeats} x "
                                    f"{args.ops} ops, {res['autograd_op_us']['median_us']:.2f} us, less this "
                                    f"profile's host.kernel_launch {launch_us:.2f} us"),
            RECORD_FAMILY: how + (f"the reference runner's recording: {RECORD_CHAIN} of its elementwise ops and "
                                  f"{RECORD_CHAIN} linears, forward and backward, on a recorded step less the next, "
                                  f"unrecorded step, the device busy, per StepGraph op, median of {args.repeats} "
                                  f"paired repeats, {res['record_op_us']['median_us']:.2f} us"),
            SYNC_FAMILY: how + (f"host time of torch.where of one expert's slice of a one-hot routing mask on an idle "
                                f"device, median of {args.repeats} x {max(1, args.ops // 10)} calls, "
                                f"{res['where_us']['median_us']:.2f} us"),
        }
        if res.get("stream_op_us"):
            notes[STREAM_FAMILY] = how + (
                f"an eager expert loop ({STREAM_EXPERTS} experts of {STREAM_ROWS} rows, hidden {STREAM_HIDDEN}, GELU "
                f"MLP {STREAM_FFN}; the runner's ExpertStreams and expert kernels), forward with autograd and "
                f"backward, the device busy, on N streams less on one stream, per StepGraph op "
                f"({STREAM_OPS_PER_EXPERT} per expert), median of paired repeats: " +
                ", ".join(f"N = {n}: {v['median_us']:.2f} us" for n, v in sorted(res["stream_op_us"].items(),
                                                                                    key=lambda kv: int(kv[0]))))
        if res.get("attention_plan_us") is not None:
            notes[ATTENTION_PLAN_FAMILY] = how + (
                "host time of F.scaled_dot_product_attention's first call at a key length new to the process "
                "(one query per sequence, batch 16, 16 heads of 128 or 32 over 4 KV groups), less the median of "
                f"the next 5 calls, median of {res['attention_plan_us']['repeats']} lengths, "
                f"{res['attention_plan_us']['median_us']:.0f} us")
        path = os.path.join(args.out, "framework_families.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(families_toml(text, args.profile, res, notes))
        report["framework_op_us"] = max(res["eager_op_us"]["median_us"] - launch_us, 0.01)
        report["framework_backward_op_us"] = max(res["autograd_node_us"]["median_us"] - launch_us, 0.01)
        report["framework_sync_us"] = res["where_us"]["median_us"]
        report["framework_autograd_op_us"] = max(res["autograd_op_us"]["median_us"] - launch_us, 0.01)
        report["framework_record_op_us"] = res["record_op_us"]["median_us"]
        report["profile"] = args.profile
        report["families"] = path
        measured = FAMILIES + ((ATTENTION_PLAN_FAMILY,) if res.get("attention_plan_us") is not None else ()) + \
            ((STREAM_FAMILY,) if res.get("stream_op_us") else ())
        report["merge"] = f"threewalls_merge_families {args.profile} {path} OUT.toml " + " ".join(measured)
        if res.get("attention_plan_us") is not None:
            report["framework_attention_plan_us"] = res["attention_plan_us"]["median_us"]
    with open(os.path.join(args.out, "framework.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    for k, v in res.items():
        if k == "stream_op_us" and v:
            print(f"{k:20s} " + ", ".join(f"N = {n}: {f['median_us']:.2f} us" for n, f in v.items()))
            continue
        v = v["median_us"] if isinstance(v, dict) else v
        print(f"{k:20s} {'n/a' if v is None else f'{v:.2f} us'}")
    if "framework_op_us" in report:
        for fam in FAMILIES + ((ATTENTION_PLAN_FAMILY,) if "framework_attention_plan_us" in report else ()):
            print(f"{fam:28s} {report[fam.split('.')[1] + '_us']:.2f} us")
        print(f"families: {report['families']}\nmerge:    {report['merge']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
