"""A tied embedding across a rank's stages and across ranks, as Megatron runs it
(ppsim.executor.builders.tied has the rule inside one stage).

A rank holding both end stages (a V placement) gives the head the table's Parameter
itself. Where the first and last stage are on two ranks, the head's copy starts equal to
the table (the embedding built here from the same seed, this tensor rank's rows) and,
after the last backward, the two copies' gradients are summed over a group of those two
ranks, one group per data-parallel replica and tensor rank (Megatron's
_allreduce_word_embedding_grads over its embedding group), before the data-parallel
reduce: the copies then step alike. Summing before the replicas reduce gives the sum
Megatron's order gives (the two reductions commute) while every rank still holds its
whole gradient, whichever way the replicas reduce (DDP, distributed optimizer, FSDP).
Both engines tie so: the ppsim runtime and the torch peer (ppsim.executor.peer), whose one
replica reduces after torch's schedule step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ppsim.executor.builders import ModelBuilder
from ppsim.executor.builders.stage import Stage, embedding_piece
from ppsim.executor.builders.tied import copy_table, share_table, table, ties


@dataclass(frozen=True)
class TiedCopy:
    """This rank's copy of a table tied across two ranks, and the pair's group."""

    weight: nn.Parameter
    group: Any
    wire: torch.device

    def reduce(self) -> None:
        """Sum the two copies' gradients (on the wire device, as the replicas' reduce)."""
        grad = self.weight.grad  # a view of the replicas' flat buffer, there from the start
        buf = grad if grad.device == self.wire else grad.to(self.wire)
        dist.all_reduce(buf, group=self.group)
        if buf is not grad:
            grad.copy_(buf)


def tie_ends(modules: dict[int, Stage], builder: ModelBuilder, split: Any, replica: Any,
             seed: int, wire: torch.device) -> TiedCopy | None:
    """Tie this rank's ends (`modules`: its stages by index, built and on the device);
    where the ends are on two ranks, every rank makes every pair's group (a collective
    call) and the pair's members get their TiedCopy. None where nothing is to reduce."""
    if not ties(builder):
        return None
    last = split.num_stages - 1
    first_rank, last_rank = split.stage_rank(0), split.stage_rank(last)
    emb, head = modules.get(0), modules.get(last)
    if first_rank == last_rank:  # one rank holds both: one table
        if emb is not None and head is not None and emb is not head:
            share_table(head.head, emb.embedding)
        return None
    pp, mine = split.pp, None
    for i in range(replica.size):
        for t in range(replica.tp):
            at = replace(replica, index=i, tp_rank=t)
            group = dist.new_group([at.global_rank(first_rank, pp),
                                    at.global_rank(last_rank, pp)])
            if (i, t) == (replica.index, replica.tp_rank):
                mine = group
    if emb is not None:
        return TiedCopy(table(emb.embedding), mine, wire)
    if head is not None:
        copy_table(head.head, embedding_piece(builder, seed))
        return TiedCopy(head.head.out.weight, mine, wire)
    return None
