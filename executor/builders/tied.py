"""A tied embedding (`tie_embeddings = true`): the LM head's weight is the embedding's
table, as Megatron ties them (share_embeddings_and_output_weights).

Where one stage holds both ends (pp = 1) or one rank holds both end stages (a V
placement: ZB-V, DualPipeV), the head's projection is the table's Parameter itself: one
weight, one gradient (both uses accumulate into it), one optimizer state. Where the ends
are on two ranks, each keeps a copy, the head's made equal to the table when it is built,
and the two gradients are summed between them before the step (ppsim.executor.tied), so
the copies step alike.

A builder ties when its `tie_embeddings` is true; its embedding piece then holds the
table as `tokens` (an nn.Embedding) and its head the projection as `out` (an nn.Linear),
as the shipped builders' do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def ties(builder: Any) -> bool:
    """Whether `builder`'s head shares its embedding's table."""
    return bool(getattr(builder, "tie_embeddings", False))


def table(embedding: nn.Module) -> nn.Parameter:
    """The embedding piece's token table (this tensor rank's rows at tp > 1)."""
    return embedding.tokens.weight  # type: ignore[union-attr, return-value]


def share_table(head: nn.Module, embedding: nn.Module) -> None:
    """The head's projection uses the embedding's table itself (one Parameter)."""
    head.out.weight = table(embedding)  # type: ignore[union-attr]


def copy_table(head: nn.Module, embedding: nn.Module) -> None:
    """The head's own copy made equal to the embedding's table (in the head's dtype)."""
    with torch.no_grad():
        head.out.weight.copy_(table(embedding))  # type: ignore[union-attr, operator]
