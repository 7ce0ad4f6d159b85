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

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def ties(builder: Any) -> bool:
    """Whether `builder`'s head shares its embedding's table."""
    return bool(getattr(builder, "tie_embeddings", False))


def tie_refusal(builder: Any, split: Callable[[nn.Module, str], Any] | None = None
                ) -> str | None:
    """Why `builder`'s pieces cannot share one table (None where they can): no `tokens`
    table in its embedding, no `out` projection in its head, or the two of other shapes
    (after `split(module, piece)`: a builder's own tensor-parallel split, which must keep
    the same rows of both). The pieces are built on the meta device, so a model of any
    size is checked before a process starts in no memory; a builder that cannot build
    there is left to its ranks."""
    try:
        with torch.device("meta"):
            embedding, head = builder.embedding(), builder.head()
            if split is not None:
                split(embedding, "embedding")
                split(head, "head")
    except Exception:  # noqa: BLE001 - e.g. a piece reading data at build time
        return None
    tokens = getattr(getattr(embedding, "tokens", None), "weight", None)
    out = getattr(getattr(head, "out", None), "weight", None)
    if not isinstance(tokens, torch.Tensor):
        return f"its embedding piece ({type(embedding).__name__}) has no table `tokens`"
    if not isinstance(out, torch.Tensor):
        return f"its head piece ({type(head).__name__}) has no projection `out`"
    if tokens.shape != out.shape:
        return (f"its table `tokens` is {tuple(tokens.shape)} but its head's projection "
                f"`out` {tuple(out.shape)}" + (" once split" if split else ""))
    return None


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
