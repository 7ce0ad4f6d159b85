"""Tensor parallelism for the built-in GPT: column- and row-parallel linears over gloo.

Megatron's split (Shoeybi et al. 2019): each tensor-parallel rank holds a slice of the
query heads, of the key/value heads and of the MLP's hidden units; the QKV and first MLP
matmuls are column-parallel (their input copied in, its gradient all-reduced on the way
back), the attention output and second MLP matmuls row-parallel (their partial outputs
all-reduced, the bias added once after). Norms, the embedding and the head stay whole on
every rank: their inputs and gradients are the same everywhere, so they stay in step with
no collective. Every rank builds the whole layer from the same seed and keeps its slice,
so the model is the one a single process builds (ppsim.executor.reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True, kw_only=True)
class TensorGroup:
    """This rank's tensor-parallel group."""

    group: Any
    """The torch.distributed process group."""
    rank: int
    """This rank's index in it."""
    size: int
    """Tensor-parallel ranks."""


_CURRENT: list[TensorGroup | None] = [None]


def set_group(g: TensorGroup | None) -> None:
    """The group the layers built from now on shard over (the worker sets it once)."""
    _CURRENT[0] = g if g is not None and g.size > 1 else None


def current() -> TensorGroup | None:
    return _CURRENT[0]


class _Copy(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (a column-parallel input)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Reduce(torch.autograd.Function):
    """All-reduce forward; identity backward (a row-parallel output)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_in(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    return _Copy.apply(x, g.group)


def reduce_out(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    return _Reduce.apply(x, g.group)


def _keep(linear: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    linear.weight = nn.Parameter(weight.contiguous().clone())
    if bias is not None:
        linear.bias = nn.Parameter(bias.contiguous().clone())
    linear.out_features, linear.in_features = linear.weight.shape


def shard_output(linear: nn.Linear, g: TensorGroup, groups: int = 1) -> None:
    """Column-parallel: keep this rank's slice of the outputs. `groups` packed blocks
    (K and V in one matmul) are each sliced alike."""
    w = linear.weight.detach().view(groups, -1, linear.in_features)
    n = w.shape[1] // g.size
    part = slice(g.rank * n, (g.rank + 1) * n)
    b = linear.bias.detach().view(groups, -1)[:, part].reshape(-1) if linear.bias is not None \
        else None
    _keep(linear, w[:, part].reshape(-1, linear.in_features), b)


def shard_input(linear: nn.Linear, g: TensorGroup) -> None:
    """Row-parallel: keep this rank's slice of the inputs; the bias stays whole (it is
    added once, after the partial outputs are summed)."""
    n = linear.in_features // g.size
    w = linear.weight.detach()[:, g.rank * n:(g.rank + 1) * n]
    _keep(linear, w, linear.bias.detach() if linear.bias is not None else None)
