"""Tensor parallelism for a builder of your own: its `parallelize(module, piece, tp)` splits
each piece ppsim builds ("embedding", "layer", "head") with `tp`'s methods, as a
torchtitan model's parallelize function applies torch's ColwiseParallel, RowwiseParallel
and SequenceParallel styles to named submodules.

The split pieces stay plain tensors and plain parameters (no DTensor), so they run through
the same executor as the shipped builders: the same collectives over gloo or NCCL
(ppsim.executor.builders.tensor), pipeline messages of each rank's tokens under sequence
parallelism, data parallelism, memory policies and measured peaks. Every rank builds the
whole piece from its seed before `parallelize` keeps its slice, so tp x pp x dp gives the
one-process loss. A module that reshapes by head count must read it from its tensors
(`view(b, s, -1, head_dim)`, as torchtitan's do) or have `parallelize` divide it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ppsim.executor.builders import layer_kind
from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.tensor import (
    ALL_GATHER,
    TensorGroup,
    column_parallel,
    exchanged,
    mark_partial,
    reduce_out,
    shard_input,
    shard_output,
    shard_segments,
)
from ppsim.executor.builders.vocab import shard_rows, vocab_parallel_embedding


def _vocab_gathered(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """Every rank's logits (its part of the vocabulary, the last dimension), in rank order."""
    local = x.movedim(-1, 0).contiguous()
    out = local.new_empty((local.shape[0] * g.size, *local.shape[1:]))
    with timed("tp"):
        ALL_GATHER(out, local, group=g.group)
    return out.movedim(0, -1).contiguous()


def _vocab_own(x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """This rank's part of the last dimension."""
    n = x.shape[-1] // g.size
    return x.narrow(-1, g.rank * n, n).contiguous()


def _divides(what: str, n: int, size: int) -> None:
    if n % size:
        raise ValueError(f"{what} ({n}) does not divide by tp ({size})")


@dataclass(frozen=True)
class TensorParallel:
    """How a builder's `parallelize` splits a piece over the tensor-parallel ranks."""

    group: TensorGroup
    """This rank's tensor-parallel group (its process group None on a dry run)."""

    @property
    def size(self) -> int:
        """Tensor-parallel ranks."""
        return self.group.size

    @property
    def rank(self) -> int:
        """This rank's index among them."""
        return self.group.rank

    @property
    def sequence_parallel(self) -> bool:
        """The hidden states between the blocks are split by tokens (dimension 1)."""
        return self.group.sequence_parallel

    def column(self, *linears: nn.Linear, segments: tuple[int, ...] = ()) -> None:
        """Column-parallel (torch's ColwiseParallel): each linear keeps this rank's slice
        of its outputs (of each packed segment, `segments` their widths, as q, k and v in
        one matmul); its input is gathered by tokens under sequence parallelism (this
        rank's tokens kept for the backward, under torchtitan's the gathered input) or
        copied in (the gradient all-reduced)."""
        g = self.group
        for lin in linears:
            for width in segments or (lin.out_features,):
                _divides(f"{type(lin).__name__}'s output width", width, g.size)
            if segments:
                shard_segments(lin, g, segments)
            else:
                shard_output(lin, g)
            lin.forward = _ColumnForward(g, lin)  # type: ignore[method-assign]

    def row(self, *linears: nn.Linear) -> None:
        """Row-parallel (torch's RowwiseParallel): each linear keeps this rank's slice of its
        inputs; the partial outputs are reduce-scattered by tokens under sequence
        parallelism, else all-reduced; the bias, whole, added once after."""
        g = self.group
        for lin in linears:
            _divides(f"{type(lin).__name__}'s input width", lin.in_features, g.size)
            shard_input(lin, g)
            if g.sequence_parallel:
                mark_partial(lin.bias)
            lin.forward = _RowForward(g, lin)  # type: ignore[method-assign]

    def tokens(self, *modules: nn.Module) -> None:
        """Modules whole on every rank that see only this rank's tokens under sequence
        parallelism (torch's SequenceParallel: the norms): their gradients are summed over
        the ranks before the step."""
        if self.sequence_parallel:
            mark_partial(*modules)

    def embedding(self, table: nn.Embedding) -> None:
        """The vocabulary split over the ranks (Megatron's VocabParallelEmbedding): each
        rank looks up its rows, the lookups summed (this rank's tokens under sequence
        parallelism)."""
        g = self.group
        _divides("the embedding's vocabulary", table.num_embeddings, g.size)
        shard_rows(table, g)
        table.forward = _EmbeddingForward(g, table)  # type: ignore[method-assign]

    def head(self, linear: nn.Linear) -> None:
        """The output layer split by vocabulary (column-parallel), its logits gathered
        over the ranks, so `loss` takes the whole vocabulary's."""
        g = self.group
        _divides("the head's vocabulary", linear.out_features, g.size)
        shard_output(linear, g)
        linear.forward = _HeadForward(g, linear)  # type: ignore[method-assign]


class _ColumnForward:
    def __init__(self, g: TensorGroup, linear: nn.Linear) -> None:
        self.g, self.linear = g, linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel(x, self.g, self.linear)[0]


class _RowForward(_ColumnForward):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_out(F.linear(x, self.linear.weight), self.g)
        return y if self.linear.bias is None else y + self.linear.bias


class _HeadForward(_ColumnForward):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        local = super().__call__(x)
        return exchanged(local, self.g, _vocab_gathered, _vocab_own)


class _EmbeddingForward:
    def __init__(self, g: TensorGroup, table: nn.Embedding) -> None:
        self.g, self.table = g, table

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_embedding(ids, self.table.weight, self.g)


def parallelized(builder: Any, module: nn.Module, piece: str, g: TensorGroup | None
                 ) -> nn.Module:
    """`module` split by the builder's own `parallelize` where a tensor group is set and
    the builder has one (the shipped builders split their pieces as they build them)."""
    split = getattr(builder, "parallelize", None)
    if g is not None and callable(split):
        split(module, piece, TensorParallel(g))
    return module


def dry_group(tp: int, sequence_parallel: bool) -> TensorGroup:
    """Rank 0 of `tp` with no process group: what a split on the meta device reads."""
    return TensorGroup(group=None, rank=0, size=tp, sequence_parallel=sequence_parallel)


def dry_run(builder: Any, tp: int, sequence_parallel: bool) -> None:
    """Split one of each piece (a layer of each kind) on the meta device (no memory, no
    collective), so a width tp does not divide fails here, before any process starts (a
    piece that cannot be built there is left to the ranks)."""
    g = dry_group(tp, sequence_parallel)
    kinds = {layer_kind(builder, i): i for i in reversed(range(builder.num_layers))}
    makes = [("embedding", builder.embedding),
             *(("layer", functools.partial(builder.layer, i)) for i in sorted(kinds.values())),
             ("head", builder.head)]
    with torch.device("meta"):
        for piece, make in makes:
            try:
                module = make()
            except Exception:  # a builder that needs real tensors: its ranks will tell
                return
            parallelized(builder, module, piece, g)
