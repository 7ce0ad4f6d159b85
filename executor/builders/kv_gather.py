"""Context-parallel attention with K and V gathered (Megatron's `--cp-comm-type
all_gather`, Transformer Engine's AttnFuncWithCPAndKVAllGather): gathered over the group
before the attention and again in the backward, where their gradients are
reduce-scattered back; a rank keeps its own K and V, not the gathered ones, for the
backward. The backward attends again against the gathered K and V to take its gradients
(no device-independent kernel takes a saved log-sum-exp), so its attention costs one
forward more than FlashAttention's.
"""

from __future__ import annotations

from typing import Any

import torch

from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.context import ContextGroup, masked_attention, visible
from ppsim.executor.builders.tensor import ALL_GATHER, REDUCE_SCATTER


def _along_tokens(x: torch.Tensor) -> torch.Tensor:
    """(b, heads, s, d) as (s, b, heads, d), contiguous: the collectives' layout."""
    return x.permute(2, 0, 1, 3).contiguous()


def _gathered(x: torch.Tensor, g: ContextGroup) -> torch.Tensor:
    """Every rank's tokens of `x` (b, heads, s, d), in rank order."""
    local = _along_tokens(x)
    out = local.new_empty((local.shape[0] * g.size, *local.shape[1:]))
    with timed("cp"):
        ALL_GATHER(out, local, group=g.group)
    return out.permute(1, 2, 0, 3)


def _scattered(x: torch.Tensor, g: ContextGroup) -> torch.Tensor:
    """The sum over the ranks of this rank's tokens of `x` (b, heads, cp x s, d)."""
    whole = _along_tokens(x)
    out = whole.new_empty((whole.shape[0] // g.size, *whole.shape[1:]))
    with timed("cp"):
        REDUCE_SCATTER(out, whole, group=g.group)
    return out.permute(1, 2, 0, 3)



class _GatheredAttention(torch.autograd.Function):
    """Attention of this rank's queries against every rank's keys and values, gathered
    in the forward and again in the backward; their gradients reduce-scattered back."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: ContextGroup, seen: torch.Tensor) -> torch.Tensor:
        ctx.g, ctx.seen = g, seen
        ctx.save_for_backward(q, k, v)
        return masked_attention(q, _gathered(k, g), _gathered(v, g), seen)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v = ctx.saved_tensors
        g = ctx.g
        # gathered before grad mode is on: gloo's all-gather writes its output's views
        keys, values = _gathered(k, g), _gathered(v, g)
        with torch.enable_grad():
            q, keys, values = (x.detach().requires_grad_() for x in (q, keys, values))
            out = masked_attention(q, keys, values, ctx.seen)
            dq, dk, dv = torch.autograd.grad(out, (q, keys, values), grad)
        return dq, _scattered(dk, g), _scattered(dv, g), None, None


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: ContextGroup,
                       places: list[torch.Tensor], window: int) -> torch.Tensor:
    """Causal attention (`window` > 0: sliding) of this rank's queries q (b, heads, s, d),
    at `places[g.rank]`, against every rank's k and v (b, kv_heads, s, d), gathered."""
    seen = visible(places[g.rank], torch.cat(places), window)
    return _GatheredAttention.apply(q, k, v, g, seen)
