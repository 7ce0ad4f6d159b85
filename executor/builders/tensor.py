"""Tensor parallelism for the shipped decoders and a builder's own
(ppsim.executor.builders.user_tp): column- and row-parallel linears over gloo (or NCCL);
and the expert-parallel group the MoE layers share their experts over
(ppsim.executor.builders.moe).

Megatron's split (Shoeybi et al. 2019): each tensor-parallel rank holds a slice of the
query heads, of the key/value heads (or, at tp above them, of an interleaved QKV:
ppsim.executor.builders.qkv_gather) and of the MLP's hidden units (and of the vocabulary:
ppsim.executor.builders.vocab); the QKV and first MLP matmuls are column-parallel (their
input copied in, its gradient all-reduced on the way back), the attention output and
second MLP matmuls row-parallel (their partial outputs all-reduced, the bias added once
after). Norms stay whole on every rank: their inputs and gradients are the same
everywhere, so they stay in step with no collective. Every rank builds the whole
layer from the same seed and keeps its slice, so the model is the one a single process
builds (ppsim.executor.reference).

Under sequence parallelism (Korthikanti et al. 2022; Megatron's --sequence-parallel) the
hidden states between the blocks are split by tokens instead: each column-parallel block
all-gathers its normed input, keeping only this rank's tokens for the backward (gathered
again there, the gradient reduce-scattered back; torchtitan's keeps the gathered input
and gathers nothing there: `TensorGroup.saves_gathered`), and each row-parallel output is
reduce-scattered (the gradient all-gathered back), so the norms, the residual adds, the
kept linear inputs and the pipeline's messages hold 1 / tp of the tokens. The weights
applied to a rank's own tokens alone (the norms, the row-parallel biases) are marked
(`mark_partial`), and their gradients are summed over the tensor ranks before the step
(`sum_partial_grads`, as Megatron's finalize_model_grads does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.context import cp_size

# torch 2.13 names them *_single; older releases *_into_tensor / *_tensor.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True, kw_only=True)
class TensorGroup:
    """This rank's tensor-parallel group."""

    group: Any
    """The torch.distributed process group."""
    rank: int
    """This rank's index in it."""
    size: int
    """Tensor-parallel ranks."""
    sequence_parallel: bool = False
    """Split the hidden states between the blocks by tokens."""
    saves_gathered: bool = False
    """Under sequence parallelism each column-parallel block keeps its gathered input for
    the backward, gathering nothing there (torchtitan's: DTensor's matmul saves the
    redistributed input; Architecture.saves_gathered_inputs), not this rank's tokens."""


@dataclass(frozen=True, kw_only=True)
class ExpertGroup:
    """This rank's expert-parallel group: the replicas whose routed experts it shares."""

    group: Any
    """The torch.distributed process group."""
    rank: int
    """This rank's index in it (it holds experts rank x E / size onwards)."""
    size: int
    """Expert-parallel ranks."""


_CURRENT: list[TensorGroup | None] = [None]
_EXPERTS: list[ExpertGroup | None] = [None]
_EXPERT_TENSOR: list[TensorGroup | None] = [None]


def set_group(g: TensorGroup | None, experts: ExpertGroup | None = None,
              expert_tensor: TensorGroup | None = None) -> None:
    """The groups the layers built from now on shard over (the worker sets them once): the
    tensor group, the expert-parallel group and the ranks each routed expert is split
    over (the tensor group itself at etp = tp)."""
    _CURRENT[0] = g if g is not None and g.size > 1 else None
    _EXPERTS[0] = experts if experts is not None and experts.size > 1 else None
    _EXPERT_TENSOR[0] = expert_tensor if expert_tensor is not None and \
        expert_tensor.size > 1 else None


def current() -> TensorGroup | None:
    return _CURRENT[0]


def expert_group() -> ExpertGroup | None:
    """The expert-parallel group set (None at ep 1)."""
    return _EXPERTS[0]


Shardable = TypeVar("Shardable")


def sliced(module: Shardable) -> Shardable:
    """`module`, built whole from its seed, keeping this rank's slice (its `shard`) where a
    tensor group is set, and its routed experts' share (`place_experts`) where an expert
    group or an expert tensor group is: so the slices put together are the one-process
    model. The experts' gradients reduce apart (their `expert_parallel` mark) unless
    they are split over the tensor group or not at all."""
    g, experts, split = current(), _EXPERTS[0], _EXPERT_TENSOR[0]
    if g is not None:
        module.shard(g)  # type: ignore[attr-defined]
    if experts is not None or split is not None:
        for m in module.modules():  # type: ignore[attr-defined]
            place = getattr(m, "place_experts", None)
            if callable(place):
                place(experts, split, apart=experts is not None or split is not g)
    return module


def _same(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    return x


def _summed(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """The sum over the ranks (an all-reduce)."""
    x = x.contiguous().clone()
    with timed("tp"):
        dist.all_reduce(x, group=g.group)
    return x


def _gathered(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """Every rank's tokens (dimension 1), in rank order. The collectives run token-major,
    as Megatron's [s, b, h] tensors are; the result is laid out (b, s, h) again, so a
    linear reading it takes it as it is (a strided one would make each linear its own
    copy to keep)."""
    local = x.transpose(0, 1).contiguous()
    out = local.new_empty((local.shape[0] * g.size, *local.shape[1:]))
    with timed("tp"):
        ALL_GATHER(out, local, group=g.group)
    return out.transpose(0, 1).contiguous()


def _scattered(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """The sum over the ranks of this rank's tokens (dimension 1), laid out (b, s, h)."""
    whole = x.transpose(0, 1).contiguous()
    out = whole.new_empty((whole.shape[0] // g.size, *whole.shape[1:]))
    with timed("tp"):
        REDUCE_SCATTER(out, whole, group=g.group)
    return out.transpose(0, 1).contiguous()


def _own(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """This rank's tokens (dimension 1)."""
    n = x.shape[1] // g.size
    return x.narrow(1, g.rank * n, n).clone(memory_format=torch.contiguous_format)


Exchange = Callable[[torch.Tensor, TensorGroup], torch.Tensor]


class _Exchanged(torch.autograd.Function):
    """`forward` on the way in, `backward` on the gradient on the way back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: TensorGroup, forward: Exchange,
                backward: Exchange) -> torch.Tensor:
        ctx.g, ctx.backward = g, backward
        return forward(x, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return ctx.backward(grad, ctx.g), None, None, None


class _GatheredLinears(torch.autograd.Function):
    """Column-parallel linears of one input all-gathered by tokens, keeping only this
    rank's tokens for the backward, which gathers them again (Megatron's
    sequence-parallel linear), or the gathered input itself (`saves_gathered`,
    torchtitan's), and reduce-scatters the input's gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: TensorGroup, linears: tuple[nn.Linear, ...],
                *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.g, ctx.linears = g, linears
        total = _gathered(x, g)
        ctx.save_for_backward(total if g.saves_gathered else x)
        return tuple(F.linear(total, lin.weight, lin.bias) for lin in linears)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        (kept,) = ctx.saved_tensors
        total = kept if ctx.g.saves_gathered else _gathered(kept, ctx.g)
        inputs = total.reshape(-1, total.shape[-1])
        grad_total = sum(gy @ lin.weight for gy, lin in zip(grads, ctx.linears, strict=True))
        out: list[torch.Tensor] = []
        for gy, lin in zip(grads, ctx.linears, strict=True):
            rows = gy.reshape(-1, gy.shape[-1])
            out.append(rows.t() @ inputs)
            if lin.bias is not None:
                out.append(rows.sum(0))
        return (_scattered(grad_total, ctx.g), None, None, *out)


def exchanged(x: torch.Tensor, g: TensorGroup, forward: Exchange,
              backward: Exchange) -> torch.Tensor:
    """`forward(x, g)`, its gradient `backward(grad, g)`."""
    return _Exchanged.apply(x, g, forward, backward)


def tokens_in(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """An activation every head of a column-parallel block reads: under sequence
    parallelism every rank's tokens gathered (the gradient reduce-scattered back), else
    the same on every rank (the gradient, each rank's heads' part, all-reduced)."""
    return _Exchanged.apply(x, g, *((_gathered, _scattered) if g.sequence_parallel
                                    else (_same, _summed)))


def column_parallel(x: torch.Tensor, g: TensorGroup,
                    *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
    """Column-parallel linears of one input: under sequence parallelism all-gathered by
    tokens (this rank's tokens kept and gathered again in the backward, or the gathered
    input kept where `g.saves_gathered`; the gradient reduce-scattered back), else copied
    in (the gradient all-reduced back)."""
    if g.sequence_parallel:
        params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
        return _GatheredLinears.apply(x, g, linears, *params)
    y = tokens_in(x, g)
    # The weights, not the modules: a builder's own linear may have this as its forward.
    return tuple(F.linear(y, lin.weight, lin.bias) for lin in linears)


class ParallelLinears:
    """Tensor-parallel linears as one piece that a memory policy wraps as it wraps a module
    (its `forward` replaced, its `parameters` the linears'): a layer's column-parallel
    projections of one normed input (the `qkv_linear` offload), or its row-parallel
    output projection (`attn_proj`)."""

    def __init__(self, g: TensorGroup, linears: tuple[nn.Linear, ...], row: bool = False
                 ) -> None:
        self.g, self.linears, self.row = g, linears, row

    def forward(self, x: torch.Tensor) -> Any:
        if not self.row:
            return column_parallel(x, self.g, *self.linears)
        linear = self.linears[0]
        y = reduce_out(F.linear(x, linear.weight), self.g)
        return y if linear.bias is None else y + linear.bias

    def __call__(self, x: torch.Tensor) -> Any:
        return self.forward(x)

    def parameters(self) -> Iterator[nn.Parameter]:
        return (p for linear in self.linears for p in linear.parameters())

    def buffers(self) -> Iterator[torch.Tensor]:
        return iter(())


def summed(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """Partial results summed over the ranks (an all-reduce; the gradient, the same on
    every rank, passed back as it is)."""
    return _Exchanged.apply(x, g, _summed, _same)


def reduce_out(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """A row-parallel block's partial outputs summed: reduce-scattered by tokens under
    sequence parallelism (the gradient all-gathered back), else all-reduced."""
    if not g.sequence_parallel:
        return summed(x, g)
    return _Exchanged.apply(x, g, _scattered, _gathered)


def split_tokens(x: torch.Tensor, g: TensorGroup | None) -> torch.Tensor:
    """The whole embedding's output as this rank's tokens under sequence parallelism
    (the gradient all-gathered back)."""
    return _Exchanged.apply(x, g, _own, _gathered) if g is not None and g.sequence_parallel \
        else x


def mark_partial(*modules: nn.Module | nn.Parameter | None) -> None:
    """Mark weights whole on every rank that each rank applies to a part alone: its own
    tokens (Megatron's `sequence_parallel` attribute: the norms, the row-parallel biases
    under sequence parallelism) or its own heads (query and key norms). Their gradients
    are partial sums."""
    for m in modules:
        params = [m] if isinstance(m, nn.Parameter) else [] if m is None else m.parameters()
        for p in params:
            p.partial_grad = True  # type: ignore[attr-defined]


def sum_partial_grads(params: list[nn.Parameter]) -> None:
    """Sum over the tensor ranks the gradients of the marked weights (in one all-reduce),
    so every rank steps them alike."""
    g = current()
    if g is None:
        return
    marked = [p for p in params if getattr(p, "partial_grad", False) and p.grad is not None]
    if not marked:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in marked])
    dist.all_reduce(flat, group=g.group)
    at = 0
    for p in marked:
        p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad))
        at += p.numel()


def message_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """What a stage sends and receives: a microbatch's hidden states `shape` (batch,
    tokens, hidden), a context-parallel rank's 1 / cp of the tokens, and of those this
    rank's under sequence parallelism."""
    g = current()
    tokens = shape[1] // cp_size()
    if g is not None and g.sequence_parallel:
        tokens //= g.size
    return (shape[0], tokens, *shape[2:])


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


def _slices(t: torch.Tensor, g: TensorGroup, sizes: tuple[int, ...]) -> torch.Tensor:
    """This rank's 1 / tp of each of the packed segments `sizes` along dimension 0."""
    return torch.cat([part.chunk(g.size, 0)[g.rank]
                      for part in t.detach().split(list(sizes), 0)]).contiguous().clone()


def shard_segments(linear: nn.Linear, g: TensorGroup, sizes: tuple[int, ...]) -> None:
    """Column-parallel over packed outputs of unequal widths (a Mamba or GatedDeltaNet
    in_proj's z, x, B, C, dt): this rank's slice of each."""
    _keep(linear, _slices(linear.weight, g, sizes),
          _slices(linear.bias, g, sizes) if linear.bias is not None else None)


def shard_channels(conv: nn.Conv1d, g: TensorGroup, sizes: tuple[int, ...]) -> None:
    """A depthwise conv's channels, packed segments of `sizes`: this rank's slice of each."""
    conv.weight = nn.Parameter(_slices(conv.weight, g, sizes))
    if conv.bias is not None:
        conv.bias = nn.Parameter(_slices(conv.bias, g, sizes))
    conv.in_channels = conv.out_channels = conv.groups = conv.weight.shape[0]


def shard_vector(param: nn.Parameter, g: TensorGroup) -> nn.Parameter:
    """This rank's 1 / tp of a per-head (or per-channel) parameter."""
    return nn.Parameter(_slices(param, g, (param.shape[0],)))


def shard_input(linear: nn.Linear, g: TensorGroup) -> None:
    """Row-parallel: keep this rank's slice of the inputs; the bias stays whole (it is
    added once, after the partial outputs are summed)."""
    n = linear.in_features // g.size
    w = linear.weight.detach()[:, g.rank * n:(g.rank + 1) * n]
    _keep(linear, w, linear.bias.detach() if linear.bias is not None else None)
