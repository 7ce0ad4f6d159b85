"""Deferred weight gradients (zero-bubble B/W split) for any model's matmuls.

While `WeightGradStore.deferring` is set, a backward through a deferring
matmul computes only the input gradient and queues the weight-gradient matmul
under the current key; the W action runs the queue later. ppsim turns every
`nn.Linear` inside a user's modules into `DeferringLinear` (same parameters,
only `forward` differs), so a builder writes plain torch. Expert matmuls use
`segmented_mm`, which defers the same way. Norm and embedding
weights (cheap, elementwise) still get their gradients in B, as in Megatron's
zero-bubble implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class WeightGradStore:
    """Queues of weight-gradient closures keyed by (stage, microbatch)."""

    enabled = False
    """True when the schedule has separate W actions; matmuls then use the deferring path."""
    deferring = False
    key: tuple[int, int] | None = None
    queues: dict[tuple[int, int], list[Callable[[], None]]] = {}

    @classmethod
    def push(cls, fn: Callable[[], None]) -> None:
        assert cls.key is not None
        cls.queues.setdefault(cls.key, []).append(fn)

    @classmethod
    def run(cls, key: tuple[int, int]) -> None:
        with torch.no_grad():
            for fn in cls.queues.pop(key, []):
                fn()

    @classmethod
    def held_bytes(cls, key: tuple[int, int]) -> int:
        """Bytes the queue keeps alive, each storage once (matmuls that share an input,
        as the query and key/value projections, keep one tensor)."""
        held: dict[int, int] = {}
        for fn in cls.queues.get(key, []):
            held.update(getattr(fn, "storages", {}))
        return sum(held.values())

    @classmethod
    def reset(cls) -> None:
        cls.enabled = cls.deferring = False
        cls.key = None
        cls.queues.clear()


def _accumulate(p: torch.Tensor, g: torch.Tensor) -> None:
    if p.grad is None:
        p.grad = g
    else:
        p.grad += g


def _defer(fn: Callable[[], None], *kept: torch.Tensor) -> None:
    # What the queue keeps alive until W: the matmul input and the output grad.
    fn.storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()  # type: ignore[attr-defined]
                   for t in kept}
    WeightGradStore.push(fn)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias = weight, bias  # parameters (leaves): a reference is enough
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, Any, Any]:
        (x,) = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        gx = gy @ weight if ctx.needs_input_grad[0] else None
        # Detached: under recompute the saved input is a recomputed (grad-tracking) tensor.
        gy2 = gy.detach().reshape(-1, gy.shape[-1])
        x2 = x.detach().reshape(-1, x.shape[-1])
        if not WeightGradStore.deferring:
            return gx, gy2.t() @ x2, (gy2.sum(0) if bias is not None else None)

        def weight_grad() -> None:
            _accumulate(weight, gy2.t() @ x2)
            if bias is not None:
                _accumulate(bias, gy2.sum(0))

        _defer(weight_grad, x2, gy2)
        return gx, None, None


class DeferringLinear(nn.Linear):
    """`nn.Linear` whose weight gradient can wait for the W action."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if WeightGradStore.enabled and torch.is_grad_enabled():
            return _LinearFn.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def defer_linears(module: nn.Module) -> int:
    """Make every plain `nn.Linear` inside `module` a `DeferringLinear`, in place.

    Only the class changes (parameters, names and hooks stay), so the swap is
    invisible to the builder and to state dicts. Returns how many were swapped.
    """
    n = 0
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = DeferringLinear
            n += 1
    return n


def _segments(x: torch.Tensor, weight: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Rows of x grouped by expert (counts[e] rows for expert e) times their expert's
    matrix: (n, a) x (E, a, b) -> (n, b)."""
    return torch.cat([xs @ weight[e] for e, xs in enumerate(x.split(counts))])


class _SegmentedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,
                counts: list[int]) -> torch.Tensor:
        ctx.save_for_backward(x)  # the tokens once: no padding, no per-expert copy
        ctx.weight, ctx.counts = weight, counts
        return _segments(x, weight, counts)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, Any, None]:
        (x,) = ctx.saved_tensors
        x, gy, weight, counts = x.detach(), gy.detach(), ctx.weight, ctx.counts
        gx = _segments(gy, weight.transpose(1, 2), counts) if ctx.needs_input_grad[0] \
            else None

        def grads() -> torch.Tensor:
            return torch.stack([xs.T @ gs for xs, gs in zip(x.split(counts), gy.split(counts),
                                                           strict=True)])

        if not ctx.needs_input_grad[1]:
            return gx, None, None
        if not WeightGradStore.deferring:
            return gx, grads(), None

        def weight_grad() -> None:
            _accumulate(weight, grads())

        _defer(weight_grad, x, gy)
        return gx, None, None


def segmented_mm(x: torch.Tensor, weight: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Dropless grouped GEMM: (n, a) rows sorted by expert, counts[e] of them for expert e,
    times (E, a, b) -> (n, b), as Megatron's grouped GEMM runs it (no expert padded to the
    busiest); keeps only x for the backward; weight grads deferrable."""
    return _SegmentedFn.apply(x, weight, counts)
