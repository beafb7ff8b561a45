"""The runner's ops, each timed as the StepGraph op of the same name (docs/stepgraph.md).

A step the profiler does not record (Profiler.phases_off) runs every op as plain PyTorch, as an
uninstrumented eager program does: F.linear, F.embedding, index_add_, torch._grouped_mm, with
PyTorch's own autograd (no Python autograd functions, no markers; one Profiler.tick() per op, which
formats a couple of waiting records). A recorded step runs the instrumented forms below; what they
cost beyond the plain ops is the price of the per-phase timing (docs/python.md, "Recorded steps").

Three kinds of timing on recorded steps, all through the profiler (threewalls.profiler):

* GEMMs and grouped GEMMs are autograd functions of their own: the forward is phase `<name>_fwd`,
  the backward runs the data gradient (`<name>_dgrad`) and the weight gradient (`<name>_wgrad`) as two
  separately timed products, in the StepGraph's order.
* Collectives (the MoE all-to-alls, gradient all-reduces) are timed around the call on the stream
  the collective runs on; their backward (an all-to-all the other way) likewise.
* Every other op (norms, attention, element-wise, permutations) runs as plain PyTorch inside phase
  `<name>_fwd`; its backward is timed between two autograd markers (threewalls.profiler.hooks): from
  the gradient reaching the op's output to the gradient of its inputs, as `<name>_bwd`.

An op's FLOPs and bytes in its record are those of the tensors it actually ran on (2 m n k for a
product; bytes read and written), not taken from the simulator.
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from threewalls.profiler.hooks import backward_box, mark_backward_begin, mark_backward_end
from threewalls.runner import kernels

BF16 = 2


class Ctx:
    """Where ops record: the profiler, and the layer / micro-batch being run."""

    def __init__(self, prof, rank: int):
        self.prof = prof
        self.rank = rank
        self.layer: Optional[int] = None
        self.mb: Optional[int] = None
        self.expert: Optional[int] = None  # the local expert of per-expert ops
        self._infos = {}

    @property
    def plain(self) -> bool:
        """Whether ops run plain (this step records no fine-grained phase): see the module's doc."""
        return self.prof.phases_off

    def saved(self) -> tuple:
        """Where the forward ran (layer, micro-batch, expert), for an autograd function's backward."""
        return self.layer, self.mb, self.expert

    def at(self, where: tuple) -> "_At":
        """`with c.at(ctx.where):` records the backward under the forward's layer, micro-batch and expert
        (autograd runs backward functions after the forward loop has moved on)."""
        return _At(self, where)

    def info(self, name: str, wall: str = "compute", flops: float = 0.0, nbytes: float = 0.0,
             expert: object = "ctx", tokens: Optional[int] = None, group: Optional[str] = None,
             group_id: Optional[int] = None, coarse: Optional[str] = None, host: bool = False,
             layer: object = "ctx"):
        lay = self.layer if layer == "ctx" else layer
        expert = self.expert if expert == "ctx" else expert
        key = (name, lay, self.mb, wall, flops, nbytes, expert, tokens, group, group_id, coarse, host)
        i = self._infos.get(key)
        if i is None:
            i = self._infos[key] = self.prof.info(name, layer=lay, microbatch=self.mb, wall=wall, flops=flops,
                                                  bytes=nbytes, expert=expert, tokens=tokens, group=group,
                                                  group_id=group_id, coarse=coarse, host=host)
        return i


class _At:
    __slots__ = ("c", "where", "prev")

    def __init__(self, c: Ctx, where: tuple):
        self.c, self.where = c, where

    def __enter__(self):
        c = self.c
        self.prev = (c.layer, c.mb, c.expert)
        c.layer, c.mb, c.expert = self.where
        return c

    def __exit__(self, *exc):
        self.c.layer, self.c.mb, self.c.expert = self.prev
        return False


def gemm_bytes(m: int, n: int, k: int, elt: int = BF16) -> float:
    return float((m * k + k * n + m * n) * elt)


# ---------------------------------------------------------------------------------------------
# GEMMs
# ---------------------------------------------------------------------------------------------

class _Linear(torch.autograd.Function):
    """y[m, n] = x[m, k] w[n, k]^T, with dgrad and wgrad timed apart."""

    @staticmethod
    def forward(ctx, c: Ctx, name: str, tokens, x, w):
        m, k = x.shape
        n = w.shape[0]
        ctx.c, ctx.where, ctx.name = c, c.saved(), name
        ctx.tokens = tokens
        ctx.save_for_backward(x, w)
        with c.prof.phase(c.info(name + "_fwd", flops=2.0 * m * n * k, nbytes=gemm_bytes(m, n, k), tokens=tokens)):
            return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        c = ctx.c
        m, k = x.shape
        n = w.shape[0]
        gx = gw = None
        with c.at(ctx.where):
            if ctx.needs_input_grad[3]:
                with c.prof.phase(c.info(ctx.name + "_dgrad", flops=2.0 * m * n * k, nbytes=gemm_bytes(m, k, n),
                                         tokens=ctx.tokens)):
                    gx = g @ w
            if ctx.needs_input_grad[4]:
                with c.prof.phase(c.info(ctx.name + "_wgrad", flops=2.0 * m * n * k, nbytes=gemm_bytes(k, n, m),
                                         tokens=ctx.tokens)):
                    gw = g.t() @ x
        return None, None, None, gx, gw


def linear(c: Ctx, name: str, x: torch.Tensor, w: torch.Tensor, tokens: Optional[int] = None) -> torch.Tensor:
    """`name` (e.g. "attn_qkv") on x [..., k] and w [n, k]: phases name_fwd, name_dgrad, name_wgrad."""
    if c.plain:
        c.prof.tick()
        return kernels.linear(x, w)
    shape = x.shape
    y = _Linear.apply(c, name, tokens, x.reshape(-1, shape[-1]), w)
    return y.reshape(*shape[:-1], w.shape[0])


def grouped_mm_impl() -> str:
    """Which grouped product this PyTorch has: "torch._grouped_mm" or "loop" (one mm per group)."""
    return "torch._grouped_mm" if hasattr(torch, "_grouped_mm") else "loop"


def _gmm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, counts: Sequence[int], kind: str) -> torch.Tensor:
    """kind "2d3d": a [R, K] (rows grouped by offs), b [G, K, N] -> [R, N];
    kind "2d2d": a [K, R], b [R, N] (the shared R grouped by offs) -> [G, K, N]."""
    if a.is_cuda and a.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(a, b, offs=offs)
    if counts is None:
        raise RuntimeError("grouped product without torch._grouped_mm needs the rows per group on the host")
    if kind == "2d3d":
        out = a.new_empty(a.shape[0], b.shape[2])
        start = 0
        for gi, n in enumerate(counts):
            out[start:start + n] = a[start:start + n] @ b[gi]
            start += n
        return out
    out = a.new_empty(len(counts), a.shape[0], b.shape[1])
    start = 0
    for gi, n in enumerate(counts):
        out[gi] = a[:, start:start + n] @ b[start:start + n]
        start += n
    return out


_GMM_AUTOGRAD = True  # whether torch._grouped_mm differentiates (else unrecorded steps use _Grouped too)


class _Grouped(torch.autograd.Function):
    """Grouped product of the experts: y[rows of g] = x[rows of g] w[g] with w [G, K, N]."""

    @staticmethod
    def forward(ctx, c: Ctx, name: str, offs, counts, x, w):
        r, k = x.shape
        g, _, n = w.shape
        ctx.c, ctx.name, ctx.where = c, name, c.saved()
        ctx.counts = counts
        ctx.save_for_backward(x, w, offs)
        nb = float(r * k * BF16 + g * k * n * BF16 + r * n * BF16)
        ctx.nb = nb
        with c.prof.phase(c.info(name + "_fwd", flops=2.0 * r * n * k, nbytes=nb, tokens=r)):
            return _gmm(x, w, offs, counts, "2d3d")

    @staticmethod
    def backward(ctx, gy):
        x, w, offs = ctx.saved_tensors
        c = ctx.c
        r, k = x.shape
        n = w.shape[2]
        with c.at(ctx.where):
            gy = gy.contiguous()
            with c.prof.phase(c.info(ctx.name + "_dgrad", flops=2.0 * r * n * k, nbytes=ctx.nb, tokens=r)):
                gx = _gmm(gy, w.transpose(1, 2), offs, ctx.counts, "2d3d")
            with c.prof.phase(c.info(ctx.name + "_wgrad", flops=2.0 * r * n * k, nbytes=ctx.nb, tokens=r)):
                gw = _gmm(x.t(), gy, offs, ctx.counts, "2d2d")
        return None, None, None, None, gx, gw


def grouped(c: Ctx, name: str, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
            counts: Optional[Sequence[int]]) -> torch.Tensor:
    """Phases name_fwd, name_dgrad, name_wgrad of a grouped GEMM over the local experts; x's rows are
    sorted by expert, `offs` their cumulative ends per expert (int32, on x's device); `counts` (rows
    per expert on the host) only where torch._grouped_mm does not run (None otherwise allowed)."""
    global _GMM_AUTOGRAD
    if c.plain and _GMM_AUTOGRAD:
        c.prof.tick()
        try:
            return _gmm(x, w, offs, counts, "2d3d")
        except RuntimeError as e:  # a PyTorch whose torch._grouped_mm has no backward: the function's own
            if "derivative" not in str(e) and "not implemented" not in str(e):
                raise
            _GMM_AUTOGRAD = False
    return _Grouped.apply(c, name, offs, None if counts is None else tuple(counts), x, w)


# ---------------------------------------------------------------------------------------------
# Plain ops with a marker-timed backward
# ---------------------------------------------------------------------------------------------

class Op:
    """`with Op(c, "attn_norm", inputs, ...) as op: y = ...; y = op.out(y)`: the forward runs in phase
    attn_norm_fwd; op.out(y) marks y so that the backward from y to `inputs` is attn_norm_bwd."""
    __slots__ = ("c", "phase", "box", "inputs", "bwd_info")

    def __init__(self, c: Ctx, name: str, inputs: Sequence[torch.Tensor], wall: str = "memory",
                 flops: float = 0.0, nbytes: float = 0.0, bwd_nbytes: Optional[float] = None,
                 bwd_flops: Optional[float] = None, expert: object = "ctx", tokens: Optional[int] = None,
                 backward: bool = True):
        self.c = c
        self.box = None
        if c.plain:
            c.prof.tick()
            self.phase = _NOOP
            self.inputs = inputs
            return
        self.phase = c.prof.phase(c.info(name + "_fwd", wall=wall, flops=flops, nbytes=nbytes, expert=expert,
                                         tokens=tokens))
        self.inputs = list(inputs)
        if backward and c.prof.recording and torch.is_grad_enabled():
            need = [t for t in self.inputs if isinstance(t, torch.Tensor) and t.requires_grad]
            if need:
                self.box = backward_box(c.prof, c.info(
                    name + "_bwd", wall=wall, flops=flops if bwd_flops is None else bwd_flops,
                    nbytes=nbytes if bwd_nbytes is None else bwd_nbytes, expert=expert, tokens=tokens), len(need))

    def __enter__(self):
        if self.box is not None:
            self.inputs = [mark_backward_end(self.box, t) if isinstance(t, torch.Tensor) and t.requires_grad else t
                           for t in self.inputs]
        self.phase.__enter__()
        return self

    def out(self, y: torch.Tensor) -> torch.Tensor:
        if self.box is not None and y.requires_grad:
            return mark_backward_begin(self.box, y)
        return y

    def __exit__(self, *exc):
        self.phase.__exit__(*exc)
        return False


# ---------------------------------------------------------------------------------------------
# Embedding and collectives
# ---------------------------------------------------------------------------------------------

class _Embedding(torch.autograd.Function):
    """Row gather (embedding_fwd); backward: the dense weight gradient (embedding_bwd)."""

    @staticmethod
    def forward(ctx, c: Ctx, ids, w):
        t = ids.numel()
        h = w.shape[1]
        elt = w.element_size()
        ctx.c, ctx.where = c, c.saved()
        ctx.save_for_backward(ids)
        ctx.wshape = w.shape
        ctx.nbytes = float(2 * t * h * elt)
        with c.prof.phase(c.info("embedding_fwd", wall="memory", nbytes=t * h * elt + t * 8, layer=None)):
            return w.index_select(0, ids.reshape(-1))

    @staticmethod
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        c = ctx.c
        with c.at(ctx.where):
            with c.prof.phase(c.info("embedding_bwd", wall="memory", nbytes=ctx.nbytes, layer=None)):
                gw = g.new_zeros(ctx.wshape).index_add_(0, ids.reshape(-1), g)
        return None, None, gw


def embedding(c: Ctx, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows of w for ids, [ids.numel(), h]."""
    if c.plain:
        c.prof.tick()
        return kernels.embedding(ids, w)
    return _Embedding.apply(c, ids, w)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over the EP group: rows of x go to the ranks by `send` counts, `recv` counts
    arrive. Backward: the same exchange the other way. Phases `<name>_fwd` / `<name>_bwd`, group "ep"."""

    @staticmethod
    def forward(ctx, c: Ctx, name: str, group, group_id: int, send, recv, x):
        import torch.distributed as dist
        ctx.c, ctx.name, ctx.group, ctx.group_id, ctx.where = c, name, group, group_id, c.saved()
        ctx.send, ctx.recv = send, recv
        out = x.new_empty((sum(recv), x.shape[1]))
        nbytes = float(x.shape[0] * x.shape[1] * x.element_size())
        with c.prof.phase(c.info(name + "_fwd", wall="communication", nbytes=nbytes, group="ep", group_id=group_id,
                                 tokens=x.shape[0])):
            dist.all_to_all_single(out, x.contiguous(), output_split_sizes=list(recv), input_split_sizes=list(send),
                                   group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        import torch.distributed as dist
        c = ctx.c
        with c.at(ctx.where):
            out = g.new_empty((sum(ctx.send), g.shape[1]))
            nbytes = float(g.shape[0] * g.shape[1] * g.element_size())
            with c.prof.phase(c.info(ctx.name + "_bwd", wall="communication", nbytes=nbytes, group="ep",
                                     group_id=ctx.group_id, tokens=g.shape[0])):
                dist.all_to_all_single(out, g.contiguous(), output_split_sizes=list(ctx.send),
                                       input_split_sizes=list(ctx.recv), group=ctx.group)
        return None, None, None, None, None, None, out


def all_to_all(c: Ctx, name: str, x: torch.Tensor, send: Sequence[int], recv: Sequence[int], group,
               group_id: int) -> torch.Tensor:
    return _AllToAll.apply(c, name, group, group_id, tuple(send), tuple(recv), x)


class _ScatterAdd(torch.autograd.Function):
    """out[rows] += y (* w per row), in place (expert_scatter_fwd); backward: the gradient of y (and
    w) gathered from out's gradient (expert_scatter_bwd), out's gradient passing through."""

    @staticmethod
    def forward(ctx, c: Ctx, out, rows, y, w):
        n, h = y.shape
        elt = y.element_size()
        ctx.c, ctx.where = c, c.saved()
        ctx.has_w = w is not None
        ctx.save_for_backward(rows, y, w if w is not None else y.new_empty(0))
        with c.prof.phase(c.info("expert_scatter_fwd", wall="memory", tokens=n, nbytes=3.0 * n * h * elt)):
            out.index_add_(0, rows, y * w.unsqueeze(1) if w is not None else y)
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, g):
        rows, y, w = ctx.saved_tensors
        c = ctx.c
        n, h = y.shape
        gy = gw = None
        with c.at(ctx.where):
            with c.prof.phase(c.info("expert_scatter_bwd", wall="memory", tokens=n,
                                     nbytes=2.0 * n * h * y.element_size())):
                gr = g.index_select(0, rows)
                if ctx.has_w:
                    gy = gr * w.unsqueeze(1)
                    gw = (gr * y).sum(1) if ctx.needs_input_grad[4] else None
                else:
                    gy = gr
        return None, g, None, gy, gw


def scatter_add(c: Ctx, out: torch.Tensor, rows: torch.Tensor, y: torch.Tensor,
                w: Optional[torch.Tensor]) -> torch.Tensor:
    """out[rows] += y * w[:, None] (w None: += y), in place; returns out."""
    if c.plain:
        c.prof.tick()
        return kernels.expert_scatter(out, rows, y, w)
    return _ScatterAdd.apply(c, out, rows, y, w)


_NOOP = contextlib.nullcontext()  # the phase of an op on a step that records nothing (reusable)
