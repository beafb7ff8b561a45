"""The bodies of the runner's memory-bound ops, as a PyTorch program runs them.

One owner for what PyTorch executes for a StepGraph op: the runner's model (threewalls.runner.model,
run) calls these, and the benchmark of PyTorch's kernels (threewalls.bench.pytorch_kernels) times
them, forward and backward through autograd, at shapes of its own. The simulator prices an op of a
`run.framework = "pytorch_eager"` scenario with the family the benchmark measured (the profile's
`pytorch.*` kernel_terms families, docs/simulator.md "Framework kernels").

Each function is plain PyTorch (no timing, no markers). Inputs that need gradients are the caller's
business; every function is differentiable where its op has a backward.
"""
from __future__ import annotations

import contextlib
import inspect
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F


def norm(x: torch.Tensor, w: torch.Tensor, kind: str, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm (F.rms_norm where PyTorch has it) or LayerNorm over the last dimension (family
    pytorch.rmsnorm_* / pytorch.layernorm_*)."""
    if kind == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), w, None, eps)
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def act(a: torch.Tensor, swiglu: bool) -> torch.Tensor:
    """SwiGLU of [gate | up] (silu of the first half times the second: pytorch.swiglu_*) or GeLU
    (pytorch.gelu_*)."""
    if swiglu:
        f = a.shape[-1] // 2
        return F.silu(a[..., :f]) * a[..., f:]
    return F.gelu(a)


_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def _sdpa_has_gqa() -> bool:
    if not _HAS_SDPA:
        return False
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):
        return False


_SDPA_GQA = _sdpa_has_gqa()


def attention_impl() -> str:
    """What attention() runs on this PyTorch (the run header's runner.attention)."""
    if not _HAS_SDPA:
        return "math (softmax(QK^T/sqrt(d))V: this PyTorch has no scaled_dot_product_attention)"
    return "scaled_dot_product_attention" + (" (enable_gqa)" if _SDPA_GQA else " (K/V repeated per group)")


def _sdpa(q, k, v, causal: bool):
    """q [b, a, sq, d], k [b, g, skv, d], v [b, g, skv, dv] (contiguous) -> [b, a, sq, dv]."""
    a, g = q.shape[1], k.shape[1]
    if a != g and _HAS_SDPA and _SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    if a != g:
        k = k.repeat_interleave(a // g, dim=1)
        v = v.repeat_interleave(a // g, dim=1)
    if _HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        sq, skv = q.shape[2], k.shape[2]
        mask = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(skv - sq)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The attention core: q [b, a, sq, d], k [b, g, skv, d], v [b, g, skv, dv] (views of the
    projections or of the KV cache) made contiguous, scaled_dot_product_attention (GQA through
    enable_gqa where PyTorch has it), the heads laid back side by side -> [b sq, a dv]
    (pytorch_host.attention_*: its host time; the kernel is priced by the fused attention families)."""
    b, a, sq = q.shape[0], q.shape[1], q.shape[2]
    o = _sdpa(q.contiguous(), k.contiguous(), v.contiguous(), causal)
    return o.transpose(1, 2).reshape(b * sq, a * o.shape[-1])


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., k] times w [n, k] transposed (F.linear; pytorch_host.linear_*: its host time, the
    product itself priced by the GEMM families)."""
    return F.linear(x, w)


def expert_gather(src: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """An eager expert loop's rows of one expert (index_select; pytorch_host.expert_gather_*)."""
    return src.index_select(0, rows)


def expert_weights(weights: torch.Tensor, rows: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The router weights of one expert's rows: weights[rows, slot] (advanced indexing; its backward
    is an accumulating index_put_)."""
    return weights[rows, slot]


def expert_scatter(out: torch.Tensor, rows: torch.Tensor, ye: torch.Tensor, we: Optional[torch.Tensor]) -> torch.Tensor:
    """out[rows] += ye * we[:, None] (we None: += ye), in place (index_add_); with expert_weights
    before it, an eager expert loop's combine of one expert (pytorch_host.expert_scatter_*)."""
    return out.index_add_(0, rows, ye * we.unsqueeze(1) if we is not None else ye)


class ExpertStreams:
    """Experts on CUDA streams as the runner runs them ("streams:N"): expert e on stream e mod N, where
    stream 0 is the current (compute) stream and the others are side streams. `fork()` makes every side
    stream wait for the compute stream before the loop, `join()` makes the compute stream wait for them
    after it; `on(e)` is the context that issues expert e's ops on its stream and `use(e, *tensors)`
    record_streams the tensors expert e reads or writes on a side stream (for the caching allocator).
    With no streams (sequential experts, or no CUDA) every call is a no-op. The runner's loop and
    bench.framework's stream figure (host.framework_stream_op) both go through it."""

    def __init__(self, streams: Sequence) -> None:
        self.streams = list(streams)

    def fork(self) -> None:
        for st in self.streams[1:]:
            st.wait_stream(self.streams[0])

    def join(self) -> None:
        for st in self.streams[1:]:
            self.streams[0].wait_stream(st)

    def on(self, e: int):
        return torch.cuda.stream(self.streams[e % len(self.streams)]) if self.streams else contextlib.nullcontext()

    def use(self, e: int, *tensors: torch.Tensor) -> None:
        if self.streams and e % len(self.streams) != 0:
            for t in tensors:
                t.record_stream(self.streams[e % len(self.streams)])


def residual_add(residual: torch.Tensor, *ys: torch.Tensor) -> torch.Tensor:
    """The residual plus the block's output(s) (bias-dropout-add without bias and dropout; its backward
    passes the gradient to every input: pytorch.add_bwd)."""
    out = residual
    for y in ys:
        out = out + y
    return out


def route(logits: torch.Tensor, k: int, idx: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Router scores -> (weights [t, k] in the logits' dtype, expert index [t, k]): softmax over the
    experts in fp32, the top-k (unless `idx` gives the choices), the chosen probabilities gathered
    (pytorch.softmax_topk_*)."""
    probs = torch.softmax(logits.float(), dim=-1)
    if idx is None:
        _, idx = torch.topk(probs, k, dim=-1)
    return probs.gather(1, idx).to(logits.dtype), idx


def sort_rows(idx: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The routed rows in expert order: (order, token_of_row) of the flattened [t, k] choices (a stable
    sort, so each expert's rows keep token order)."""
    order = torch.sort(idx.reshape(-1), stable=True)[1]
    return order, order // k


def permute(y: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, k: int):
    """moe_permute: token rows gathered into expert order -> (rows [t k, h], their router weights,
    token_of_row). Its backward: index_select's (zeros, index_add_ of the rows) (pytorch.permute_*)."""
    order, token_of_row = sort_rows(idx, k)
    return y.index_select(0, token_of_row), weights.reshape(-1).index_select(0, order), token_of_row


def unpermute(ys: torch.Tensor, w_sorted: torch.Tensor, token_of_row: torch.Tensor, tokens: int) -> torch.Tensor:
    """moe_unpermute: expert output rows times their router weights, summed back per token
    (pytorch.unpermute_*)."""
    return ys.new_zeros(tokens, ys.shape[1]).index_add_(0, token_of_row, ys * w_sorted.unsqueeze(1))


def embedding(ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows of the table for the ids (pytorch.embedding_*)."""
    return F.embedding(ids.reshape(-1), w)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the logits cast to fp32 (pytorch.cross_entropy_*)."""
    return F.cross_entropy(logits.float(), labels.reshape(-1))


def gradients_to_main(dst: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
    """Autograd's (bf16) gradients copied into the fp32 main-gradient views `dst` of one bucket (one
    torch._foreach_copy_ where PyTorch has it)."""
    copy_all = getattr(torch, "_foreach_copy_", None)
    if copy_all is not None:
        copy_all(list(dst), list(grads))
    else:
        for d, g in zip(dst, grads):
            d.copy_(g)


def squared_norm(masters: Sequence[torch.Tensor]) -> torch.Tensor:
    """The squared gradient norm over the fp32 master weights' gradients (one float on the device)."""
    return torch.stack([torch.sum(m.grad * m.grad) for m in masters]).sum()


def clipped_step(opt: torch.optim.Optimizer, masters: Sequence[torch.Tensor], sq_norm: torch.Tensor,
                 params: Sequence[torch.Tensor], shards: Sequence[Tuple[int, int]]) -> None:
    """Gradient clipping's scale (max norm 1), the optimizer's step on the fp32 masters, each master
    copied into its slice of the bf16 weights (pytorch.adam_step)."""
    coef = torch.clamp(1.0 / (torch.sqrt(sq_norm) + 1e-6), max=1.0)
    for m in masters:
        m.grad.mul_(coef)
    opt.step()
    for m, p, (lo, hi) in zip(masters, params, shards):
        p[lo:hi].copy_(m)


def adam(masters: List[torch.Tensor], device: torch.device) -> torch.optim.Optimizer:
    """torch.optim.Adam over the masters, fused on CUDA where this PyTorch has it."""
    try:
        has_fused = "fused" in inspect.signature(torch.optim.Adam.__init__).parameters
    except (TypeError, ValueError):
        has_fused = False
    fused = device.type == "cuda" and has_fused
    return torch.optim.Adam(masters, lr=1e-4, **({"fused": True} if fused else {}))
