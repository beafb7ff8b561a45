"""PyTorch's kernels for the StepGraph's memory-bound ops, for the profile's pytorch.* families.

    python3 -m threewalls.bench.pytorch_kernels --out DIR --profile PROFILE.toml [--device cuda|cpu]
    threewalls_refit_raw DIR DIR/pytorch_kernels.toml
    threewalls_merge_families PROFILE.toml DIR/pytorch_kernels.toml OUT.toml pytorch.permute_fwd ...

A PyTorch program runs other kernels than threewalls' backend for the same op: index_select and an
atomic index_add_ where the backend gathers through a row map, a softmax in fp32 and a top-k, the
cross-entropy of logits cast to fp32, autograd's backward of a SwiGLU over slices, Adam through
torch.optim. This benchmark times the runner's op bodies (threewalls.runner.kernels, the one owner of
what PyTorch executes for each op) forward, and backward through autograd (torch.autograd.grad from
the op's output to its inputs), at shapes of its own: token counts off the powers of two, hidden
sizes off the model dimensions, so that no scenario's shape is measured.

Timing is device time: each sample queues `iters` calls behind a spin kernel (torch.cuda._sleep)
long enough for the host to enqueue them all, then CUDA events around the calls; the sample is the
events' time over `iters`. The host's cost of launching (PyTorch's dispatcher, autograd's engine) is
the host families' (host.framework_op, host.framework_backward_op; threewalls.bench.framework).

Writes DIR/points.jsonl in the calibration raw format (docs/formats/calibration_raw.md; the header's
hardware is PROFILE's, with this GPU's name and today's date) and DIR/pytorch_kernels.json (every
point's figures). `threewalls_refit_raw` fits the kernel_terms families from it (their inputs and
terms: calibration/src/kernel_terms.cpp), `threewalls_merge_families` puts them into a profile. On a
CPU (--device cpu) the shapes are divided by 64 and timed with the wall clock: a smoke test of the
plumbing, and the note says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import tomllib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from threewalls.bench.spread import p10_median_p90
from threewalls.runner import kernels

CPU_SHRINK = 64
BF16 = torch.bfloat16


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _spin_cycles(host_s: float) -> int:
    """Clock cycles of a spin that outlasts `host_s` of host enqueueing (at 2 GHz, twice over, at least
    200 us)."""
    return int(max(host_s * 2.0, 200e-6) * 2.0e9)


def time_calls(calls: Sequence[Callable[[], None]], device: torch.device, repeats: int,
               host_per_call_s: float, host: Optional[List[float]] = None) -> Tuple[List[float], bool]:
    """Seconds per call of the `calls` run back to back, one sample per repeat (see the module's doc),
    and whether the host's enqueueing outlasted the spin (the sample then holds host time too). With
    `host`, also appends each repeat's host time per call (the enqueueing, with the device busy)."""
    per: List[float] = []
    host_bound = False
    for _ in range(repeats):
        _sync(device)
        if device.type == "cuda":
            spin = _spin_cycles(host_per_call_s * len(calls))
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(spin)
            h0 = time.perf_counter()
            start.record()
            for fn in calls:
                fn()
            issued = time.perf_counter() - h0
            stop.record()
            host_bound |= issued > spin / 2.0e9
            if host is not None:
                host.append(issued / len(calls))
            stop.synchronize()
            per.append(start.elapsed_time(stop) * 1e-3 / len(calls))
        else:
            t0 = time.perf_counter()
            for fn in calls:
                fn()
            per.append((time.perf_counter() - t0) / len(calls))
            if host is not None:
                host.append(per[-1])
    return per, host_bound


def stats(samples: List[float]) -> Dict[str, float]:
    p10, med, p90 = p10_median_p90(samples)
    return {"median_s": med, "p10_s": p10, "p90_s": p90, "samples_s": samples}


def measure_op(fwd: Callable[[], object], grads_of: Optional[Callable[[object], Tuple[list, list, list]]],
               device: torch.device, iters: int, repeats: int, nograd_host: bool = True) -> Dict[str, Dict[str, object]]:
    """Forward and (where `grads_of` is given) backward device time of one op.

    `fwd()` runs the op and returns what `grads_of` needs; `grads_of(result)` gives (outputs, their
    gradients, inputs) for torch.autograd.grad. Backward samples run the iters forwards first (not
    timed), then their backwards back to back. The spin before each sample is sized from the host
    time of the last warm-up call."""
    host_f = host_b = 0.0
    for _ in range(3):  # warm-up (allocator, kernels' first launch), then the host's time per call
        _sync(device)
        h0 = time.perf_counter()
        r = fwd()
        host_f = time.perf_counter() - h0
        if grads_of is not None:
            outs, gouts, ins = grads_of(r)
            _sync(device)
            h0 = time.perf_counter()
            torch.autograd.grad(outs, ins, gouts)
            host_b = time.perf_counter() - h0
        del r
    _sync(device)
    host: List[float] = []
    samples, hb = time_calls([fwd] * iters, device, repeats, host_f, host)
    out: Dict[str, Dict[str, object]] = {"fwd": dict(stats(samples), host_bound=hb, host=stats(host))}
    if nograd_host:
        # The forward as an inference step runs it: no autograd node recorded (its host time only).
        host = []
        with torch.no_grad():
            time_calls([fwd] * iters, device, repeats, host_f, host)
        out["fwd_nograd"] = {"host": stats(host)}
    if grads_of is not None:
        samples = []
        host = []
        hb = False
        for _ in range(repeats):
            graphs = [grads_of(fwd()) for _ in range(iters)]
            calls = [(lambda g=g: torch.autograd.grad(g[0], g[2], g[1])) for g in graphs]
            one, h = time_calls(calls, device, 1, host_b, host)
            samples += one
            hb |= h
            del graphs, calls
        out["bwd"] = dict(stats(samples), host_bound=hb, host=stats(host))
    return out


def grad_call_overhead(device: torch.device, repeats: int = 15, calls: int = 50) -> float:
    """Host seconds of one torch.autograd.grad call over a graph without work (the backward of a view:
    no kernel): the engine's graph task, the hand-off to its device thread and back. A step's backward
    pays it once, not per op: the host families of backward bodies have it taken off."""
    x = torch.randn(64, 64, device=device).requires_grad_(True)
    per = []
    for _ in range(repeats):
        graphs = [x.view(-1) for _ in range(calls)]
        g = torch.ones(64 * 64, device=device)
        _sync(device)
        t0 = time.perf_counter()
        for y in graphs:
            torch.autograd.grad(y, x, g)
        per.append((time.perf_counter() - t0) / calls)
    return statistics.median(per)


# ---------------------------------------------------------------------------------------------
# The ops, each as threewalls.runner.kernels runs it
# ---------------------------------------------------------------------------------------------

def _randn(*shape, device, dtype=BF16, grad=True):
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(grad)


def _balanced_idx(t: int, k: int, e: int, device) -> torch.Tensor:
    """Token t's j-th choice is expert (t k + j) mod e, as the runner's training routing."""
    return (torch.arange(t * k, device=device) % e).reshape(t, k)


def router(t: int, e: int, k: int, device):
    logits = _randn(t, e, device=device)

    def fwd():
        return kernels.route(logits, k)

    def grads(r):
        w, _ = r
        return [w], [torch.ones_like(w)], [logits]
    return fwd, grads


def permute(t: int, k: int, h: int, device):
    y = _randn(t, h, device=device)
    e = max(8, 8 * k)
    idx = _balanced_idx(t, k, e, device)
    w = _randn(t, k, device=device)

    def fwd():
        return kernels.permute(y, idx, w, k)

    def grads(r):
        xs, ws, _ = r
        return [xs, ws], [torch.ones_like(xs), torch.ones_like(ws)], [y, w]
    return fwd, grads


def unpermute(t: int, k: int, h: int, device):
    e = max(8, 8 * k)
    _, token_of_row = kernels.sort_rows(_balanced_idx(t, k, e, device), k)
    ys = _randn(t * k, h, device=device)
    ws = _randn(t * k, device=device)

    def fwd():
        return kernels.unpermute(ys, ws, token_of_row, t)

    def grads(out):
        return [out], [torch.ones_like(out)], [ys, ws]
    return fwd, grads


def embedding(t: int, h: int, v: int, device):
    w = _randn(v, h, device=device)
    ids = torch.randint(0, v, (t,), device=device)

    def fwd():
        return kernels.embedding(ids, w)

    def grads(out):
        return [out], [torch.ones_like(out)], [w]
    return fwd, grads


def cross_entropy(t: int, v: int, device):
    logits = _randn(t, v, device=device)
    labels = torch.randint(0, v, (t,), device=device)

    def fwd():
        return kernels.cross_entropy(logits, labels)

    def grads(out):
        return [out], [torch.ones_like(out)], [logits]
    return fwd, grads


def norm(kind: str, rows: int, h: int, device):
    x = _randn(rows, h, device=device)
    w = _randn(h, device=device)

    def fwd():
        return kernels.norm(x, w, kind)

    def grads(out):
        return [out], [torch.ones_like(out)], [x, w]
    return fwd, grads


def activation(swiglu: bool, rows: int, f: int, device):
    a = _randn(rows, 2 * f if swiglu else f, device=device)

    def fwd():
        return kernels.act(a, swiglu)

    def grads(out):
        return [out], [torch.ones_like(out)], [a]
    return fwd, grads


def residual(elements: int, device):
    h = 2056
    r = _randn(max(elements // h, 1), h, device=device)
    y = _randn(max(elements // h, 1), h, device=device)

    def fwd():
        return kernels.residual_add(r, y)

    def grads(out):
        return [out], [torch.ones_like(out)], [r, y]
    return fwd, grads


def attention(b: int, sq: int, skv: int, a: int, g: int, d: int, device):
    """The attention core as the runner calls it: q a view of the [b sq, (a + 2 g) d] projection, k and v
    views of it (sq = skv, causal) or of a longer KV cache (decode: one query, a cache slice)."""
    causal = sq == skv
    if causal:
        qkv = _randn(b, sq, a + 2 * g, d, device=device)
        q, k, v = (qkv[:, :, :a].transpose(1, 2), qkv[:, :, a:a + g].transpose(1, 2),
                   qkv[:, :, a + g:].transpose(1, 2))
        leaves = [qkv]
    else:
        q = _randn(b, sq, a, d, device=device)
        cache = _randn(2, b, g, skv + 64, d, device=device, grad=False)
        k, v = cache[0, :, :, :skv], cache[1, :, :, :skv]
        leaves = [q]
        q = q.transpose(1, 2)

    def fwd():
        return kernels.attention(q, k, v, causal)

    def grads(out):
        return [out], [torch.ones_like(out)], leaves
    return fwd, grads


def linear(m: int, n: int, k: int, device):
    x = _randn(m, k, device=device)
    w = _randn(n, k, device=device)

    def fwd():
        return kernels.linear(x, w)

    def grads(out):
        return [out], [torch.ones_like(out)], [x, w]
    return fwd, grads


def expert_gather(t: int, rows: int, h: int, device):
    src = _randn(t, h, device=device)
    idx = torch.arange(rows, device=device) * max(t // rows, 1) % t

    def fwd():
        return kernels.expert_gather(src, idx)

    def grads(out):
        return [out], [torch.ones_like(out)], [src]
    return fwd, grads


def expert_scatter(t: int, rows: int, h: int, device, weighted: bool = True):
    """One expert's combine in an eager loop: its router weights gathered by (row, slot), its output
    rows scaled by them and index_add_ed into a [t, h] output (a fresh zeroed one per call). Unweighted
    (the loop over the rows an EP rank received, whose weights moe_unpermute applies after the
    combine): the rows index_add_ed as they are, the rest the same."""
    k = 4
    ye = _randn(rows, h, device=device)
    weights = _randn(t, k, device=device)
    idx = torch.arange(rows, device=device) * max(t // rows, 1) % t
    slot = torch.arange(rows, device=device) % k

    def fwd():
        out = torch.zeros(t, h, device=device, dtype=BF16)
        return kernels.expert_scatter(out, idx, ye, kernels.expert_weights(weights, idx, slot) if weighted else None)

    def grads(out):
        return [out], [torch.ones_like(out)], [ye, weights] if weighted else [ye]
    return fwd, grads


def _model_state(n: int, device, tensor_elems: int, bucket_elems: int):
    """n parameters as the runner holds them: bf16 weights with bf16 gradients in tensors of
    tensor_elems, grouped into buckets of about bucket_elems with an fp32 master, gradient buffer
    and bf16 flat weight per bucket."""
    sizes = [tensor_elems] * (n // tensor_elems) + ([n % tensor_elems] if n % tensor_elems else [])
    buckets: List[List[int]] = [[]]
    for s in sizes:
        if buckets[-1] and sum(buckets[-1]) + s > bucket_elems:
            buckets.append([])
        buckets[-1].append(s)
    grads, views, masters, params, shards = [], [], [], [], []
    for b in buckets:
        total = sum(b)
        buf = torch.zeros(total, device=device, dtype=torch.float32)
        m = torch.randn(total, device=device, dtype=torch.float32).requires_grad_(True)
        m.grad = buf
        offs = 0
        vs, gs = [], []
        for s in b:
            vs.append(buf[offs:offs + s])
            gs.append(torch.randn(s, device=device, dtype=BF16))
            offs += s
        grads.append(gs)
        views.append(vs)
        masters.append(m)
        params.append(torch.zeros(total, device=device, dtype=BF16))
        shards.append((0, total))
    return grads, views, masters, params, shards


def grad_norm(n: int, device, tensor_elems: int, bucket_elems: int):
    _, _, masters, _, _ = _model_state(n, device, tensor_elems, bucket_elems)

    def fwd():
        return kernels.squared_norm(masters)
    return fwd, None


def adam_step(n: int, device, tensor_elems: int, bucket_elems: int):
    _, _, masters, params, shards = _model_state(n, device, tensor_elems, bucket_elems)
    opt = kernels.adam(masters, device)
    sq = torch.ones((), device=device)

    def fwd():
        kernels.clipped_step(opt, masters, sq, params, shards)
    return fwd, None


# ---------------------------------------------------------------------------------------------
# The grid: family -> points (inputs in the family's order: calibration/src/kernel_terms.cpp)
# ---------------------------------------------------------------------------------------------

class Bench:
    """One op of threewalls.runner.kernels over a grid: its forward feeds family `fwd`, its backward
    family `bwd` (either may be None). `points`: (the families' inputs, make's arguments)."""

    def __init__(self, fwd: Optional[str], bwd: Optional[str], keys: Sequence[str],
                 points: Sequence[Tuple[Sequence[float], Sequence[int]]],
                 make: Callable[..., Tuple[Callable, Optional[Callable]]], bytes_of: Callable[[Sequence[float]], float],
                 device_families: bool = True):
        self.fwd, self.bwd, self.keys, self.make, self.bytes_of = fwd, bwd, list(keys), make, bytes_of
        # False: only the host families (pytorch_host.*) are written; the device time of the op is
        # another family's (the attention core's: the fused attention families).
        self.device_families = device_families
        self.points = [(list(map(float, i)), list(a)) for i, a in points]

    def families(self) -> List[str]:
        return [f for f in (self.fwd, self.bwd) if f]


def op_of(family: str) -> str:
    """The benchmark op of a pytorch.* or pytorch_host.* family (the op of its row in
    calibration/src/kernel_terms.cpp)."""
    prefix, rest = family.split(".", 1)
    return prefix + "_" + rest


def host_family_of(family: str) -> str:
    """The host family of a pytorch.* family: pytorch_host.<same op> (the host's time per call of the
    op's body with the device busy, forward with and without autograd recording, or backward)."""
    return "pytorch_host." + family.split(".", 1)[1]


def benches(device: torch.device, shrink: int) -> List[Bench]:
    """Every pytorch.* family's op and grid (shapes divided by `shrink` on a CPU)."""
    def s(x: float) -> int:
        return max(int(x) // shrink, 2)

    out: List[Bench] = []
    pts = [((s(t), e, k), (s(t), e, k)) for t in (300, 3000, 12000, 27000)
           for (e, k) in ((8, 2), (64, 8), (128, 8), (256, 8))]
    out.append(Bench("pytorch.softmax_topk_fwd", "pytorch.softmax_topk_bwd", ["tokens", "experts", "topk"], pts,
                     lambda t, e, k: router(t, e, k, device), lambda p: p[0] * p[1] * 6.0))
    pts = [((s(t), k, s(h)), (s(t), k, s(h))) for t in (300, 2000, 6000, 12000) for k in (2, 8)
           for h in (1000, 2056, 4104)]
    for name, make in (("permute", permute), ("unpermute", unpermute)):
        out.append(Bench(f"pytorch.{name}_fwd", f"pytorch.{name}_bwd", ["tokens", "topk", "hidden"], pts,
                         lambda t, k, h, make=make: make(t, k, h, device), lambda p: p[0] * p[1] * p[2] * 4.0))
    pts = [((s(t), s(h), s(v)), (s(t), s(h), s(v))) for t in (300, 2000, 12000) for h in (1000, 4104)
           for v in (8000, 50000)]
    out.append(Bench("pytorch.embedding_fwd", "pytorch.embedding_bwd", ["tokens", "hidden", "vocab"], pts,
                     lambda t, h, v: embedding(t, h, v, device), lambda p: p[0] * p[1] * 4.0))
    pts = [((s(t), s(v)), (s(t), s(v))) for t in (300, 2000, 9000) for v in (1000, 8000, 30000, 60000)]
    out.append(Bench("pytorch.cross_entropy_fwd", "pytorch.cross_entropy_bwd", ["tokens", "shard"], pts,
                     lambda t, v: cross_entropy(t, v, device), lambda p: p[0] * p[1] * 6.0))
    pts = [((s(r), s(h)), (s(r), s(h))) for r in (300, 2000, 12000) for h in (1000, 2056, 4104, 7000)]
    for kind in ("rmsnorm", "layernorm"):
        out.append(Bench(f"pytorch.{kind}_fwd", f"pytorch.{kind}_bwd", ["rows", "hidden"], pts,
                         lambda r, h, kind=kind: norm(kind, r, h, device), lambda p: p[0] * p[1] * 4.0))
    # The activations' input: the op's output elements (rows x f), as the StepGraph counts them.
    pts = [((s(r) * f,), (s(r), f)) for r in (300, 3000, 12000, 30000) for f in (704, 1400, 2816)]
    for name, swiglu in (("swiglu", True), ("gelu", False)):
        out.append(Bench(f"pytorch.{name}_fwd", f"pytorch.{name}_bwd", ["elements"], pts,
                         lambda r, f, swiglu=swiglu: activation(swiglu, r, f, device), lambda p: p[0] * 6.0))
    pts = [((s(e) // 2056 * 2056,), (s(e),)) for e in (2.0e5, 2.0e6, 2.0e7, 6.0e7)]
    out.append(Bench(None, "pytorch.add_bwd", ["elements"], pts, lambda e: residual(e, device),
                     lambda p: p[0] * 6.0))
    # The attention core (b, sq, skv, heads, kv groups, head dim). Training and prefill (causal,
    # sq = skv): its host time only (the kernel is the fused attention families'). Decode (one query
    # over a slice of a KV cache): device time too, family pytorch.attention_decode by (batch, keys,
    # heads, KV heads, qk + v head dims): the slices made contiguous and the SDPA kernel PyTorch picks.
    def b_of(b: int) -> int:
        return b if shrink == 1 else 1
    pts = [((b_of(b), s(sq), s(sq), a, g, d), (b_of(b), s(sq), s(sq), a, g, d))
           for (b, sq) in ((1, 3000), (2, 1500)) for (a, g, d) in ((16, 16, 128), (24, 4, 96))]
    out.append(Bench("pytorch.attention_fwd", "pytorch.attention_bwd",
                     ["batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"], pts,
                     lambda b, sq, skv, a, g, d: attention(b, sq, skv, a, g, d, device),
                     lambda p: p[0] * (p[1] * p[3] + 2 * p[2] * p[4]) * p[5] * 2.0, device_families=False))
    pts = [((b_of(b), s(skv), a, g, 2 * d), (b_of(b), 1, s(skv), a, g, d))
           for (b, skv) in ((6, 400), (24, 900), (48, 1700), (80, 3000))
           for (a, g, d) in ((16, 16, 128), (24, 4, 96), (40, 8, 64))]
    out.append(Bench("pytorch.attention_decode", None, ["batch", "seq_kv", "heads", "kv_heads", "head_dims"], pts,
                     lambda b, sq, skv, a, g, d: attention(b, sq, skv, a, g, d, device),
                     lambda p: p[0] * p[1] * p[3] * p[4] * 2.0 * 2.0))
    # GEMMs (F.linear) and an eager expert loop's gather and combine (with router weights, and without:
    # the loop over an EP rank's received rows): host time only (their device time is the GEMM
    # families' and the permute / unpermute families').
    pts = [((s(m), s(n), s(kk)), (s(m), s(n), s(kk))) for (m, n, kk) in
           ((40, 1000, 1000), (700, 2900, 1000), (3000, 1400, 4104), (12000, 4104, 2056))]
    out.append(Bench("pytorch.linear_fwd", "pytorch.linear_bwd", ["m", "n", "k"], pts,
                     lambda m, n, kk: linear(m, n, kk, device), lambda p: 2.0 * (p[0] * p[2] + p[1] * p[2] + p[0] * p[1]),
                     device_families=False))
    pts = [((s(t), s(r), s(h)), (s(t), s(r), s(h))) for (t, r, h) in
           ((300, 40, 4104), (3000, 300, 1000), (12000, 1500, 2056), (9000, 4000, 1400))]
    for name, make in (("expert_gather", expert_gather), ("expert_scatter", expert_scatter),
                       ("expert_scatter_unweighted", lambda t, r, h, d: expert_scatter(t, r, h, d, weighted=False))):
        out.append(Bench(f"pytorch.{name}_fwd", f"pytorch.{name}_bwd", ["tokens", "rows", "hidden"], pts,
                         lambda t, r, h, make=make: make(t, r, h, device), lambda p: p[1] * p[2] * 4.0,
                         device_families=False))
    tensor_elems, bucket_elems = max(4_000_000 // shrink, 64), max(64_000_000 // shrink, 1024)
    pts = [((s(n),), (s(n),)) for n in (2.0e6 + 40, 2.0e7 + 40, 1.0e8 + 40, 4.0e8 + 40, 1.0e9 + 40)]
    out.append(Bench("pytorch.grad_norm", None, ["parameters"], pts,
                     lambda n: grad_norm(n, device, tensor_elems, bucket_elems), lambda p: p[0] * 4.0))
    out.append(Bench("pytorch.adam_step", None, ["parameters"], pts,
                     lambda n: adam_step(n, device, tensor_elems, bucket_elems), lambda p: p[0] * 34.0))
    return out


# ---------------------------------------------------------------------------------------------
# Output: the calibration raw format
# ---------------------------------------------------------------------------------------------

def header(profile_path: str, device: torch.device, argv: List[str]) -> Dict[str, object]:
    with open(profile_path, "rb") as f:
        doc = tomllib.load(f)
    try:
        hw = dict(doc["hardware"])
    except KeyError:
        raise SystemExit(f"{profile_path}: no [hardware] table: not a threewalls calibration profile") from None
    today = datetime.datetime.now(datetime.timezone.utc)
    hw["date"] = today.strftime("%Y-%m-%d")
    if device.type == "cuda":
        hw["gpu_name"] = torch.cuda.get_device_name(device)
        hw["gpus_seen"] = 1
    hw["machine"] = (f"{hw.get('machine', '')}; PyTorch {torch.__version__} kernels measured by "
                     f"threewalls.bench.pytorch_kernels" + ("" if device.type == "cuda" else
                                                           " on the CPU (a smoke test, not a calibration)"))
    import threewalls
    return {"format": "threewalls.calibration_raw", "format_version": "1.0",
            "tool_version": getattr(threewalls, "__version__", "0.1.0") + f" (python, torch {torch.__version__})",
            "git_sha": "unknown", "mode": "full", "started": today.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "argv": ["python3", "-m", "threewalls.bench.pytorch_kernels", *argv], "gpus_used": 1,
            "hardware": hw, "topology": "one GPU (PyTorch benchmark)"}


def record(family: str, keys: Sequence[str], inputs: Sequence[float], nbytes: float, st: Dict[str, object],
           wall_s: float, reps: int) -> Dict[str, object]:
    med = float(st["median_s"])
    return {"op": op_of(family), "family": family, "params": dict(zip(keys, inputs)), "inputs": list(inputs),
            "held_out": False, "group_size": 1, "flops": 0.0, "bytes": nbytes, "status": "ok", "reps": reps,
            "stop": "max_samples", "rel_ci": None, "wall_s": wall_s,
            "check": ("host-bound: the host's enqueueing outlasted the spin (the time holds host time)"
                      if st.get("host_bound") else "not checked: PyTorch's own kernels"), "median_s": med, "p10_s": float(st["p10_s"]),
            "p90_s": float(st["p90_s"]), "samples_s": list(st["samples_s"]),
            "metrics": {"gb_per_s": nbytes / med / 1e9 if med > 0 else 0.0}}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python3 -m threewalls.bench.pytorch_kernels",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to write (points.jsonl must not exist in it)")
    ap.add_argument("--profile", required=True, help="calibration profile whose [hardware] the raw header copies")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--iters", type=int, default=10, help="calls per sample")
    ap.add_argument("--repeats", type=int, default=5, help="samples per point")
    ap.add_argument("--only", default="", help="comma-separated families (default: all)")
    ap.add_argument("--max-points", type=int, default=0, help="only the first N points of each op (0: all)")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: PyTorch sees no CUDA device")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "points.jsonl")
    if os.path.exists(path):
        raise SystemExit(f"{path} exists: a raw folder is never overwritten")
    only = {f for f in args.only.split(",") if f}
    shrink = 1 if device.type == "cuda" else CPU_SHRINK
    todo = [b for b in benches(device, shrink) if not only or set(b.families()) & only]
    known = {f for b in benches(device, shrink) for f in b.families()}
    if only - known:
        raise SystemExit(f"--only: unknown families {sorted(only - known)}; known: {sorted(known)}")
    grad_call_s = grad_call_overhead(device)
    print(f"torch.autograd.grad call without work: {grad_call_s * 1e6:.2f} us (taken off the backward host times)")
    report: Dict[str, object] = {"device": str(device), "torch": torch.__version__,
                                 "grad_call_overhead_us": grad_call_s * 1e6, "points": []}
    with open(path, "w") as f:
        f.write(json.dumps(header(args.profile, device, argv)) + "\n")
        f.flush()
        for b in todo:
            pts = b.points[:args.max_points] if args.max_points else b.points
            for inputs, make_args in pts:
                t0 = time.perf_counter()
                fwd, grads = b.make(*make_args)
                # The optimizer's families launch a few kernels per tensor: two calls per sample keep
                # the queue below CUDA's pending-launch limit.
                per_tensor = b.keys == ["parameters"]  # the optimizer's: no host family (a loop per tensor)
                iters = min(args.iters, 2) if per_tensor else args.iters
                res = measure_op(fwd, grads if b.bwd else None, device, iters, args.repeats, nograd_host=not per_tensor)
                wall = time.perf_counter() - t0
                del fwd, grads
                for fam, key in ((b.fwd, "fwd"), (b.bwd, "bwd")):
                    if not fam or (only and fam not in only):
                        continue
                    rec = record(fam, b.keys, inputs, b.bytes_of(inputs), res[key], wall, iters)
                    if b.device_families:
                        f.write(json.dumps(rec) + "\n")
                        f.flush()
                    report["points"].append({"family": fam, "inputs": inputs, "median_us": rec["median_s"] * 1e6,
                                             "host_bound": bool(res[key].get("host_bound"))})
                    print(f"{fam:28s} {' '.join(f'{k}={v:g}' for k, v in zip(b.keys, inputs)):44s} "
                          f"{rec['median_s'] * 1e6:10.2f} us", flush=True)
                    if per_tensor:
                        continue  # the optimizer's ops: a host loop per tensor, not one body per op
                    hosts = [(1.0, res[key]["host"])]
                    if key == "fwd" and "fwd_nograd" in res:
                        hosts.append((0.0, res["fwd_nograd"]["host"]))
                    off = grad_call_s if key == "bwd" else 0.0
                    for autograd, st in hosts:
                        # A body cheaper than the timing's noise keeps a floor of 10 ns (times are positive).
                        st = {k: ([max(x - off, 1e-8) for x in v] if isinstance(v, list) else max(v - off, 1e-8))
                              for k, v in st.items()}
                        hrec = record(host_family_of(fam), ["autograd"], [autograd], 0.0, st, wall, iters)
                        hrec["check"] = ("host time per call of the op's body, the device busy (not a kernel time)" +
                                         (f"; less one torch.autograd.grad call without work, {off * 1e6:.2f} us"
                                          if off else ""))
                        f.write(json.dumps(hrec) + "\n")
                        f.flush()
                        report["points"].append({"family": hrec["family"], "inputs": [autograd],
                                                 "median_us": hrec["median_s"] * 1e6, "shape": inputs})
                        print(f"{hrec['family']:28s} autograd={autograd:g} {'':33s}"
                              f"{hrec['median_s'] * 1e6:10.2f} us (host; {' '.join(f'{k}={v:g}' for k, v in zip(b.keys, inputs))})",
                              flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    with open(os.path.join(args.out, "pytorch_kernels.json"), "w") as f:
        json.dump(report, f, indent=1)
    toml_out = os.path.join(args.out, "pytorch_kernels.toml")
    fams = sorted({p["family"] for p in report["points"]} - {f for b in todo if not b.device_families
                                                              for f in b.families()})
    print(f"raw:   {path}\nrefit: threewalls_refit_raw {args.out} {toml_out}\n"
          f"merge: threewalls_merge_families {args.profile} {toml_out} OUT.toml {' '.join(fams)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
