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
and cost nothing on unrecorded steps beyond one branch per hook.
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
    fwd_info = prof.info(fwd_name, layer=layer, **kw)
    bwd_info = prof.info(bwd_name, layer=layer, **kw)
    state = {"token": None, "box": None}

    def pre(mod, args):
        if not prof.recording:
            return None
        state["token"] = prof.begin_phase(fwd_info)
        if not backward or not torch.is_grad_enabled():
            state["box"] = None
            return None
        n = sum(1 for a in args if isinstance(a, torch.Tensor) and a.requires_grad)
        if n == 0:
            state["box"] = None
            return None
        box = backward_box(prof, bwd_info, n)
        state["box"] = box
        if box is None:
            return None
        return tuple(mark_backward_end(box, a) if isinstance(a, torch.Tensor) and a.requires_grad else a
                     for a in args)

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

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
