"""The shipped builders' embedding and head at tp > 1, as Megatron's: the vocabulary split
over the tensor ranks and the loss computed across them.

The embedding looks up the ids in this rank's rows (zeros for the others) and sums the
ranks' lookups (VocabParallelEmbedding): a reduce-scatter by tokens under sequence
parallelism, else an all-reduce; beside learned positions an all-reduce, the positions
added, the sum then split by tokens under sequence parallelism (Megatron's
LanguageModelEmbedding reduce-scatters only without position embeddings).

The output layer (ppsim.executor.builders.common.Head) is column-parallel (its input
gathered by tokens under sequence parallelism), so each rank holds the logits
of vocab / tp entries. The cross-entropy (Megatron's vocab_parallel_cross_entropy) takes
the largest logit, the sum of the exponentials and the target's logit with one
all-reduce each over the ranks' parts, keeps this rank's fp32 softmax for the backward
and writes its gradient in place there: softmax less one at the target, over the tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.common import stage_loss
from ppsim.executor.builders.tensor import (
    TensorGroup,
    current,
    reduce_out,
    split_tokens,
    summed,
)


def shard_rows(table: nn.Embedding, g: TensorGroup) -> None:
    """Keep this rank's vocab / tp rows of an embedding table."""
    n = table.num_embeddings // g.size
    table.weight = nn.Parameter(table.weight.detach()[g.rank * n:(g.rank + 1) * n].clone())
    table.num_embeddings = n


def vocab_parallel_embedding(ids: torch.Tensor, rows: torch.Tensor, g: TensorGroup,
                             positions: torch.Tensor | None = None) -> torch.Tensor:
    """The ids' embeddings from this rank's `rows` (zeros for ids outside them) summed
    over the ranks, plus the `positions`' (whole on every rank), as the first stage
    sends them: this rank's tokens under sequence parallelism."""
    first = g.rank * rows.shape[0]
    outside = (ids < first) | (ids >= first + rows.shape[0])
    local = F.embedding((ids - first).masked_fill(outside, 0), rows)
    local = local.masked_fill(outside[..., None], 0.0)
    if positions is None:
        return reduce_out(local, g)
    return split_tokens(summed(local, g) + positions, g)


class _VocabParallelLoss(torch.autograd.Function):
    """Mean token cross-entropy of logits split by vocabulary over the ranks."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor,
                g: TensorGroup) -> torch.Tensor:
        rows = logits.float().reshape(-1, logits.shape[-1])
        part, target = rows.shape[-1], targets.reshape(-1)
        first = g.rank * part
        peak = rows.max(dim=-1).values
        with timed("tp"):
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=g.group)
        shifted = rows - peak[:, None]
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        with timed("tp"):
            dist.all_reduce(total, group=g.group)
        mine = (target >= first) & (target < first + part)
        index = (target - first).clamp(0, part - 1)
        picked = shifted.gather(1, index[:, None]).squeeze(1) * mine
        with timed("tp"):
            dist.all_reduce(picked, group=g.group)
        exp.div_(total[:, None])  # this rank's softmax, kept for the backward
        ctx.save_for_backward(exp, index, mine)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return (total.log() - picked).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        softmax, index, mine = ctx.saved_tensors
        softmax.scatter_add_(1, index[:, None], -mine.to(softmax.dtype)[:, None])
        softmax.mul_(grad / softmax.shape[0])
        return softmax.view(ctx.shape).to(ctx.dtype), None, None


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean token cross-entropy: over the vocabulary's parts at tp > 1 (the same on
    every tensor rank), else in one piece."""
    g = current()
    return stage_loss(logits, targets) if g is None else \
        _VocabParallelLoss.apply(logits, targets, g)
