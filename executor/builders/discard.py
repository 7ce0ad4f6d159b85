"""Output-discarding recompute: Megatron's `layernorm` and `moe_act` recompute modules.

A whole-module checkpoint keeps a module's inputs and drops what it saves inside;
its output is still kept by whoever consumes it (the projections after a norm, the
expert down-projection after the activation). Megatron's CheckpointWithoutOutput
also frees that output: the module runs without autograd, its input is kept, and
once the consumers have run the output's storage is resized to nothing; before the
consumers' backward it is recomputed into the same storage (a storage copy, so the
consumers' saved tensors see no in-place change) and the module's own backward runs
through that recomputation.

Here the storage is freed when the layer's forward ends (one scope per layer and
microbatch) and refilled when the layer's backward begins (an identity on the
layer's output), which bounds the same bytes per microbatch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ppsim.executor.builders import stage as stage_mod

_TENSOR = object()


class _Discarded:
    """One discarded output: the forward that made it, its node (whose saved tensors are
    the inputs, reloaded if offloaded), and once recomputed the graph its own backward
    runs through."""

    def __init__(self, forward: Callable[..., torch.Tensor], inputs: tuple[Any, ...]) -> None:
        self.forward = forward
        # Tensors are taken from the node's saved tensors (_TENSOR marks their places),
        # so nothing here keeps an input alive beside what autograd saved.
        self.constants = [_TENSOR if torch.is_tensor(a) else a for a in inputs]
        self.node: Callable[[], Any] = lambda: None
        self.output: torch.Tensor | None = None
        self.nbytes = 0
        self.graph: tuple[list[Any], torch.Tensor] | None = None

    def recompute(self) -> tuple[list[Any], torch.Tensor]:
        """The module's forward again, with autograd, on detached copies of its inputs."""
        if self.graph is None:
            saved = iter(self.node().saved_tensors)
            leaves = [next(saved).detach().requires_grad_() if c is _TENSOR else c
                      for c in self.constants]
            with torch.enable_grad():
                self.graph = (leaves, self.forward(*leaves))
        return self.graph

    def refill(self) -> None:
        """Recompute the output into its freed storage (before any consumer's backward)."""
        if self.output is None or self.output.untyped_storage().nbytes() == self.nbytes:
            return
        _, again = self.recompute()
        storage = self.output.untyped_storage()
        storage.resize_(self.nbytes)
        with torch.no_grad():
            storage.copy_(again.untyped_storage())


class _DiscardingFn(torch.autograd.Function):
    """The module's forward without autograd (its inputs saved), its backward through the
    recomputation."""

    @staticmethod
    def forward(ctx: Any, rec: _Discarded, *inputs: Any) -> torch.Tensor:
        ctx.rec = rec
        rec.node = weakref.ref(ctx)
        ctx.save_for_backward(*[a for a in inputs if torch.is_tensor(a)])
        out = rec.forward(*inputs)
        rec.output, rec.nbytes = out, out.untyped_storage().nbytes()
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        rec: _Discarded = ctx.rec
        leaves, again = rec.recompute()
        torch.autograd.backward(again, grad)
        rec.graph = None
        return (None, *[a.grad if torch.is_tensor(a) else None for a in leaves])


class _RefillFn(torch.autograd.Function):
    """Identity on a layer's output whose backward refills the layer's discarded outputs."""

    @staticmethod
    def forward(ctx: Any, scope: list[_Discarded], x: torch.Tensor) -> torch.Tensor:
        ctx.scope = scope
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        for rec in ctx.scope:
            rec.refill()
        return None, grad


_open: list[list[_Discarded]] = []
"""The scopes of the layers whose forward is running (innermost last)."""


def discarding(forward: Callable[..., torch.Tensor], *inputs: Any) -> torch.Tensor:
    if not torch.is_grad_enabled() or not _open:
        return forward(*inputs)
    rec = _Discarded(forward, inputs)
    out = _DiscardingFn.apply(rec, *inputs)
    _open[-1].append(rec)
    return out


def pending(t: torch.Tensor) -> bool:
    """t's storage is an output the open layer will discard (offload leaves it alone)."""
    ptr = t.untyped_storage().data_ptr()
    return bool(_open) and any(r.output is not None
                               and r.output.untyped_storage().data_ptr() == ptr
                               for r in _open[-1])


def _free(scope: list[_Discarded]) -> None:
    for rec in scope:
        assert rec.output is not None
        storage = rec.output.untyped_storage()
        for seen in stage_mod.counters():  # no longer kept, whoever saved it
            seen.pop(storage.data_ptr(), None)
        storage.resize_(0)


def layer_scope(forward: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    scope: list[_Discarded] = []
    _open.append(scope)
    try:
        out = forward(*args, **kwargs)
    finally:
        _open.pop()
    if not scope:
        return out
    _free(scope)
    return _RefillFn.apply(scope, out)
