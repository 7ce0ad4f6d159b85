"""Context parallelism for the shipped decoders: each rank of a context-parallel group holds
2 of the sequence's 2 x cp chunks, and its attention sees every rank's keys and values.

Megatron's causal load balancing (`get_batch_on_this_cp_rank`): the sequence is cut into
2 x cp chunks and rank c keeps chunks c and 2cp - 1 - c, so every rank does the same share
of the causal s x s work. Everything outside the attention is per token and runs on the
rank's s / cp tokens as it stands; the positions (learned or rotary) are the tokens'
places in the whole sequence.

The attention gathers K and V over the group before it and again in the backward, where
their gradients are reduce-scattered back (Transformer Engine's
AttnFuncWithCPAndKVAllGather, Megatron's `--cp-comm-type all_gather`): a rank keeps its
own K and V, not the gathered ones, for the backward. The backward attends again against
the gathered K and V to take its gradients (no device-independent kernel takes a saved
log-sum-exp), so its attention costs one forward more than FlashAttention's.

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

from ppsim.executor.builders.tensor import ALL_GATHER, REDUCE_SCATTER


@dataclass(frozen=True, kw_only=True)
class ContextGroup:
    """This rank's context-parallel group."""

    group: Any
    """The torch.distributed process group."""
    rank: int
    """This rank's index in it: it holds chunks rank and 2 x size - 1 - rank."""
    size: int
    """Context-parallel ranks."""


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


def _along_tokens(x: torch.Tensor) -> torch.Tensor:
    """(b, heads, s, d) as (s, b, heads, d), contiguous: the collectives' layout."""
    return x.permute(2, 0, 1, 3).contiguous()


def _gathered(x: torch.Tensor, g: ContextGroup) -> torch.Tensor:
    """Every rank's tokens of `x` (b, heads, s, d), in rank order."""
    local = _along_tokens(x)
    out = local.new_empty((local.shape[0] * g.size, *local.shape[1:]))
    ALL_GATHER(out, local, group=g.group)
    return out.permute(1, 2, 0, 3)


def _scattered(x: torch.Tensor, g: ContextGroup) -> torch.Tensor:
    """The sum over the ranks of this rank's tokens of `x` (b, heads, cp x s, d)."""
    whole = _along_tokens(x)
    out = whole.new_empty((whole.shape[0] // g.size, *whole.shape[1:]))
    REDUCE_SCATTER(out, whole, group=g.group)
    return out.permute(1, 2, 0, 3)


def visible(query: torch.Tensor, key: torch.Tensor, window: int) -> torch.Tensor:
    """Which keys each query attends to, by their places in the sequence: itself and those
    before it, at most `window` back (0: all)."""
    behind = query[:, None] - key[None, :]
    seen = behind >= 0
    return seen & (behind <= window) if window > 0 else seen


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor,
            unfused: bool) -> torch.Tensor:
    if unfused:  # as ppsim.executor.builders.stage.unfused_attention, K and V repeated
        repeat = q.shape[1] // k.shape[1]
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~seen, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=seen,
                                          enable_gqa=k.shape[1] != q.shape[1])


class _GatheredAttention(torch.autograd.Function):
    """Attention of this rank's queries against every rank's keys and values, gathered
    in the forward and again in the backward; their gradients reduce-scattered back."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: ContextGroup, seen: torch.Tensor, unfused: bool) -> torch.Tensor:
        ctx.g, ctx.seen, ctx.unfused = g, seen, unfused
        ctx.save_for_backward(q, k, v)
        return _attend(q, _gathered(k, g), _gathered(v, g), seen, unfused)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v = ctx.saved_tensors
        g = ctx.g
        keys, values = _gathered(k, g), _gathered(v, g)  # (the collectives outside autograd)
        with torch.enable_grad():
            q, keys, values = (x.detach().requires_grad_() for x in (q, keys, values))
            out = _attend(q, keys, values, ctx.seen, ctx.unfused)
            dq, dk, dv = torch.autograd.grad(out, (q, keys, values), grad)
        return dq, _scattered(dk, g), _scattered(dv, g), None, None, None


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                      unfused: bool) -> torch.Tensor:
    """Causal attention (a `window` > 0: sliding) of this rank's queries q (b, heads, s, d)
    against every context-parallel rank's k and v (b, kv_heads, s, d)."""
    g = context()
    assert g is not None
    local = q.shape[2]
    mine = chunk_positions(local * g.size, g.size, g.rank)
    every = torch.cat([chunk_positions(local * g.size, g.size, r) for r in range(g.size)])
    seq = local * g.size
    seen = visible(mine, every, window if 0 < window < seq - 1 else 0).to(q.device)
    return _GatheredAttention.apply(q, k, v, g, seen, unfused)
