"""Output-discarding recompute: Megatron's `layernorm`, `moe_act` and `mla_up_proj`
recompute modules.

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
        self.outputs: tuple[torch.Tensor, ...] = ()
        """The outputs (one, or MLA's q, k and v), their storages freed and refilled."""
        self.nbytes: tuple[int, ...] = ()
        self.graph: tuple[list[Any], tuple[torch.Tensor, ...]] | None = None

    def recompute(self) -> tuple[list[Any], tuple[torch.Tensor, ...]]:
        """The module's forward again, with autograd, on detached copies of its inputs."""
        if self.graph is None:
            saved = iter(self.node().saved_tensors)
            leaves = [next(saved).detach().requires_grad_() if c is _TENSOR else c
                      for c in self.constants]
            with torch.enable_grad():
                self.graph = (leaves, _tensors(self.forward(*leaves)))
        return self.graph

    def refill(self) -> None:
        """Recompute the outputs into their freed storages (before any consumer's
        backward)."""
        if all(o.untyped_storage().nbytes() == n for o, n in zip(self.outputs, self.nbytes,
                                                                  strict=True)):
            return
        _, again = self.recompute()
        for out, nbytes, new in zip(self.outputs, self.nbytes, again, strict=True):
            storage = out.untyped_storage()
            storage.resize_(nbytes)
            with torch.no_grad():
                storage.copy_(new.untyped_storage())


def _tensors(out: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


class _DiscardingFn(torch.autograd.Function):
    """The module's forward without autograd (its inputs saved), its backward through the
    recomputation."""

    @staticmethod
    def forward(ctx: Any, rec: _Discarded, *inputs: Any) -> Any:
        ctx.rec = rec
        rec.node = weakref.ref(ctx)
        ctx.save_for_backward(*[a for a in inputs if torch.is_tensor(a)])
        out = rec.forward(*inputs)
        rec.outputs = _tensors(out)
        rec.nbytes = tuple(o.untyped_storage().nbytes() for o in rec.outputs)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        rec: _Discarded = ctx.rec
        leaves, again = rec.recompute()
        torch.autograd.backward(again, grads)
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


def discarding(forward: Callable[..., Any], *inputs: Any) -> Any:
    if not torch.is_grad_enabled() or not _open:
        return forward(*inputs)
    rec = _Discarded(forward, inputs)
    out = _DiscardingFn.apply(rec, *inputs)
    _open[-1].append(rec)
    return out


def pending(t: torch.Tensor) -> bool:
    """t's storage is an output the open layer will discard (offload leaves it alone)."""
    ptr = t.untyped_storage().data_ptr()
    return bool(_open) and any(o.untyped_storage().data_ptr() == ptr
                               for r in _open[-1] for o in r.outputs)


def _free(scope: list[_Discarded]) -> None:
    for out in (o for rec in scope for o in rec.outputs):
        storage = out.untyped_storage()
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
