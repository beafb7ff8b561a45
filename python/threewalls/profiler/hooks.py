"""Phases from module hooks and autograd markers.

Forward: a forward pre-hook opens `<name>_fwd`, a forward hook closes it.
Backward: identity autograd markers (one function, two roles) mark where the module's backward starts and ends. The
forward hook passes the module's outputs through a begin marker, whose backward runs when the
gradient reaches the outputs (it opens `<name>_bwd`); the pre-hook passes the module's inputs that
require grad through an end marker, whose backward runs once the gradient of an input is computed
(it closes the phase; with several inputs, the last one closes it). Both run on autograd's thread,
with the stream autograd uses for the module's backward current, so the CUDA events land on the
stream the backward kernels run on.

The markers work on every PyTorch version from 1.13 on (no register_full_backward_pre_hook needed)
and cost nothing on unrecorded steps beyond one branch per hook. Inputs passed by keyword (as
transformers calls its attention modules) are marked too from PyTorch 2.0 on (forward pre-hooks with
keyword arguments); before 2.0 only positional inputs are.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from threewalls.errors import InputError


class _Box:
    """The backward phase of one module call: opened by the first begin marker whose backward runs,
    closed by the last end marker's."""
    __slots__ = ("prof", "info", "token", "ends")

    def __init__(self, prof, info, ends: int):
        self.prof = prof
        self.info = info
        self.token = None
        self.ends = ends

    def open(self) -> None:
        if self.token is None:
            self.token = self.prof.begin_phase(self.info)

    def close(self) -> None:
        self.ends -= 1
        if self.ends == 0 and self.token is not None:
            if self.prof._cur is not None:
                self.prof.end_phase(self.token)
            self.token = None


class _Marker(torch.autograd.Function):
    """Identity in the forward; in the backward, opens (begin) or closes the box's phase."""

    @staticmethod
    def forward(ctx, box, begin: bool, x):
        ctx.box = box
        ctx.begin = begin
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.begin:
            ctx.box.open()
        else:
            ctx.box.close()
        return None, None, g


def mark_backward_begin(box: _Box, x: torch.Tensor) -> torch.Tensor:
    return _Marker.apply(box, True, x)


def mark_backward_end(box: _Box, x: torch.Tensor) -> torch.Tensor:
    return _Marker.apply(box, False, x)


def backward_box(prof, info, ends: int = 1) -> Optional[_Box]:
    """A box for a backward phase to be opened by mark_backward_begin and closed by mark_backward_end
    (`ends` of them), or None on an unrecorded step."""
    if not prof.recording or not prof.policy.records_phase(info.coarse):
        return None
    return _Box(prof, info, ends)


def hook_module(prof, module, fwd_name: str, bwd_name: str, layer: Optional[int], backward: bool,
                kw: dict) -> List[Any]:
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"hook_module: {type(module).__name__} is not a torch.nn.Module")
    mb = kw.pop("microbatch", None)
    current_mb = mb if callable(mb) else (lambda: mb)
    infos = {}

    def info_pair():
        """The forward and backward phase descriptions for the current micro-batch (made once each)."""
        m = current_mb()
        pair = infos.get(m)
        if pair is None:
            pair = infos[m] = (prof.info(fwd_name, layer=layer, microbatch=m, **kw),
                               prof.info(bwd_name, layer=layer, microbatch=m, **kw))
        return pair

    info_pair()  # a bad keyword is an error now, not at the first recorded step
    state = {"token": None, "box": None}

    def needs_grad(x) -> bool:
        return isinstance(x, torch.Tensor) and x.requires_grad

    def open_phase(args, kwargs):
        """Opens the forward phase; marks the inputs that require grad (positional and keyword) for
        the backward phase and returns them, or None when nothing is marked."""
        fwd_info, bwd_info = info_pair()
        state["token"] = prof.begin_phase(fwd_info)
        state["box"] = None
        if not backward or not torch.is_grad_enabled():
            return None
        n = sum(1 for a in args if needs_grad(a)) + sum(1 for v in kwargs.values() if needs_grad(v))
        if n == 0:
            return None
        box = backward_box(prof, bwd_info, n)
        state["box"] = box
        if box is None:
            return None
        return (tuple(mark_backward_end(box, a) if needs_grad(a) else a for a in args),
                {k: mark_backward_end(box, v) if needs_grad(v) else v for k, v in kwargs.items()})

    def pre_kw(mod, args, kwargs):
        if not prof.recording:
            return None
        return open_phase(args, kwargs)

    def pre(mod, args):  # PyTorch before 2.0: the hook sees positional inputs only
        if not prof.recording:
            return None
        marked = open_phase(args, {})
        return None if marked is None else marked[0]

    def post(mod, args, out):
        if not prof.recording:
            return None
        prof.end_phase(state["token"])
        state["token"] = None
        box = state["box"]
        state["box"] = None
        if box is None:
            return None
        if isinstance(out, torch.Tensor):
            return mark_backward_begin(box, out) if out.requires_grad else out
        if isinstance(out, tuple):
            return tuple(mark_backward_begin(box, o) if isinstance(o, torch.Tensor) and o.requires_grad else o
                         for o in out)
        return None  # other output types: the backward phase opens at its first marker only if any

    try:
        pre_handle = module.register_forward_pre_hook(pre_kw, with_kwargs=True)
    except TypeError:  # PyTorch before 2.0
        pre_handle = module.register_forward_pre_hook(pre)
    return [pre_handle, module.register_forward_hook(post)]
