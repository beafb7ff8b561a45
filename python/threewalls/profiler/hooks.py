"""Phases from module hooks and autograd markers.

Forward: a forward pre-hook opens `<name>_fwd`, a forward hook closes it.
Backward: the forward hook registers a tensor hook on each of the module's outputs that requires
grad; autograd runs it when that output's gradient is complete (every consumer has given its part),
where the module's backward starts, and the first one to run opens `<name>_bwd`. The pre-hook
passes each input that requires grad through an identity autograd function (the end marker), so that
the module works on an input of its own: the marker's backward runs once the module's part of the
input's gradient is computed, whatever else consumes the input, and the last one closes the phase.
Both run on autograd's thread with the stream of the module's backward current (autograd guards the
stream of the node it runs, hooks included), so the CUDA events land on the stream the backward
kernels run on.

A tensor hook is the cheaper of the two (no autograd node, no Python function per call): the begin
needs no isolation, as an output's gradient is complete exactly when the module's backward can
start; the end does, as an input may have other consumers whose gradients arrive later.

The markers work on every PyTorch version from 1.13 on (no register_full_backward_pre_hook needed).
The hooks are on their modules only while a recorded step runs (HookSet): an unrecorded step calls
the modules through PyTorch's path without hooks. Inputs passed by keyword (as
transformers calls its attention modules) are marked too from PyTorch 2.0 on (forward pre-hooks with
keyword arguments); before 2.0 only positional inputs are.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from threewalls.errors import InputError


class _Box:
    """The backward phase of one module call: opened by the first output hook that runs, closed by
    the last end marker's backward."""
    __slots__ = ("prof", "info", "token", "ends")

    def __init__(self, prof, info, ends: int):
        self.prof = prof
        self.info = info
        self.token = None
        self.ends = ends

    def on_grad(self, grad):
        """Tensor hook of an output: its gradient is complete, the module's backward starts."""
        if self.token is None:
            self.token = self.prof.begin_phase(self.info)

    def close(self) -> None:
        self.ends -= 1
        if self.ends == 0 and self.token is not None:
            if self.prof._cur is not None:
                self.prof.end_phase(self.token)
            self.token = None


class _EndMarker(torch.autograd.Function):
    """Identity in the forward (a view of the input); in the backward, closes the box's phase."""

    @staticmethod
    def forward(ctx, box, x):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.box.close()
        return None, g


def mark_backward_begin(box: _Box, x: torch.Tensor) -> torch.Tensor:
    """x itself, with a tensor hook that opens the box's phase when x's gradient is complete (x must
    require grad)."""
    x.register_hook(box.on_grad)
    return x


def mark_backward_end(box: _Box, x: torch.Tensor) -> torch.Tensor:
    """A view of x whose backward closes the box's phase (the last of the box's `ends` closes it):
    the caller's op uses the view, so the phase ends when that op's part of x's gradient is done."""
    return _EndMarker.apply(box, x)


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

    def open_phase(args, kwargs):
        """Opens the forward phase; marks the inputs that require grad (positional and keyword) for
        the backward phase and returns them, or None when nothing is marked."""
        fwd_info, bwd_info = info_pair()
        state["token"] = prof.begin_phase(fwd_info)
        state["box"] = None
        if not backward or not torch.is_grad_enabled():
            return None
        n = 0
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                n += 1
        if kwargs:
            for v in kwargs.values():
                if isinstance(v, torch.Tensor) and v.requires_grad:
                    n += 1
        if n == 0:
            return None
        box = backward_box(prof, bwd_info, n)
        state["box"] = box
        if box is None:
            return None
        args = tuple([mark_backward_end(box, a) if isinstance(a, torch.Tensor) and a.requires_grad else a
                      for a in args])
        if kwargs:
            kwargs = {k: mark_backward_end(box, v) if isinstance(v, torch.Tensor) and v.requires_grad else v
                      for k, v in kwargs.items()}
        return args, kwargs

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
        # The outputs stay the module's own tensors; hooks mark where their gradients are complete.
        if isinstance(out, torch.Tensor):
            if out.requires_grad:
                out.register_hook(box.on_grad)
        elif isinstance(out, tuple):
            for o in out:
                if isinstance(o, torch.Tensor) and o.requires_grad:
                    o.register_hook(box.on_grad)
        return None  # other output types get no hook: the backward phase is not recorded

    hooks = HookSet(prof, module, pre_kw, pre, post)
    prof._add_hooks(hooks)
    return [hooks]


class HookSet:
    """One module's forward pre-hook and forward hook, registered with the module only while a
    recorded step runs (the profiler installs and removes them at the step's start and end): on
    other steps the module's call takes PyTorch's path without hooks and costs nothing extra.
    remove() undoes hook_module."""
    __slots__ = ("prof", "module", "pre_kw", "pre", "post", "handles")

    def __init__(self, prof, module, pre_kw, pre, post):
        self.prof = prof
        self.module = module
        self.pre_kw = pre_kw
        self.pre = pre
        self.post = post
        self.handles: List[Any] = []

    def install(self) -> None:
        if self.handles:
            return
        try:
            h = self.module.register_forward_pre_hook(self.pre_kw, with_kwargs=True)
        except TypeError:  # PyTorch before 2.0
            h = self.module.register_forward_pre_hook(self.pre)
        self.handles = [h, self.module.register_forward_hook(self.post)]

    def uninstall(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def remove(self) -> None:
        self.uninstall()
        self.prof._drop_hooks(self)
