"""Context parallelism for the shipped decoders: each rank of a context-parallel group holds
2 of the sequence's 2 x cp chunks, and its attention sees every rank's keys and values
(ppsim.executor.builders.cp_attention).

Megatron's causal load balancing (`get_batch_on_this_cp_rank`): the sequence is cut into
2 x cp chunks and rank c keeps chunks c and 2cp - 1 - c, so every rank does the same share
of the causal s x s work. Everything outside the attention is per token and runs on the
rank's s / cp tokens as it stands; the positions (learned or rotary) are the tokens'
places in the whole sequence.

The weights are the same on every rank of the group, so their gradients are reduced over
it as over the data-parallel replicas (Megatron's data-and-context-parallel group): the
executor counts each context-parallel rank as a replica that reads its replica's batch
(ppsim.executor.runtime.Replica).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True, kw_only=True)
class ContextGroup:
    """This rank's context-parallel group."""

    group: Any
    """The torch.distributed process group."""
    rank: int
    """This rank's index in it: it holds chunks rank and 2 x size - 1 - rank."""
    size: int
    """Context-parallel ranks."""
    comm: str = "p2p"
    """How the attention sees the other ranks' keys and values (Megatron's
    --cp-comm-type): p2p round a ring, all_gather, or a2a (the heads exchanged; see
    ppsim.executor.builders.cp_attention)."""
    heads_group: ContextGroup | None = None
    """Under a2a+p2p: the cp_a2a_size consecutive ranks the heads are exchanged over."""
    ring_group: ContextGroup | None = None
    """Under a2a+p2p: the ranks at this one's place in each of those, round whose ring
    K and V pass."""


_CURRENT: list[ContextGroup | None] = [None]


def set_context(g: ContextGroup | None) -> None:
    """The context-parallel group the attention gathers over (the worker sets it once)."""
    _CURRENT[0] = g if g is not None and g.size > 1 else None


def context() -> ContextGroup | None:
    """The context-parallel group set (None at cp 1)."""
    return _CURRENT[0]


def cp_size() -> int:
    """Context-parallel ranks of this rank's group (1: none)."""
    g = context()
    return 1 if g is None else g.size


def chunk_positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """The places in a sequence of `seq` tokens of context-parallel rank `rank`'s tokens:
    chunks rank and 2cp - 1 - rank of 2cp, in that order."""
    if seq % (2 * cp):
        raise ValueError(f"a sequence of {seq} tokens does not cut into 2 x cp = {2 * cp} "
                         "chunks")
    n = seq // (2 * cp)
    first, second = rank * n, (2 * cp - 1 - rank) * n
    return torch.cat((torch.arange(first, first + n), torch.arange(second, second + n)))


def token_positions(local: int, device: torch.device) -> torch.Tensor:
    """The places in the whole sequence of this rank's `local` tokens."""
    g = context()
    if g is None:
        return torch.arange(local, device=device)
    return chunk_positions(local * g.size, g.size, g.rank).to(device)


def own_tokens(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of a whole sequence's `x` along `dim` (1: ids and targets; 0: a
    rotary table's rows, so a layer built after the group is set reads its first s / cp
    rows as its tokens' places)."""
    g = context()
    if g is None:
        return x
    return x.index_select(dim, chunk_positions(x.shape[dim], g.size, g.rank).to(x.device))


def visible(query: torch.Tensor, key: torch.Tensor, window: int) -> torch.Tensor:
    """Which keys each query attends to, by their places in the sequence: itself and those
    before it, at most `window` back (0: all)."""
    behind = query[:, None] - key[None, :]
    seen = behind >= 0
    return seen & (behind <= window) if window > 0 else seen


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor
                     ) -> torch.Tensor:
    """The fused attention of q (b, heads, s, d) against k and v (b, kv_heads, s', d),
    each query seeing the keys `seen` marks (grouped-query where kv_heads < heads)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=seen,
                                          enable_gqa=k.shape[1] != q.shape[1])
