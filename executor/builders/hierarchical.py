"""Hierarchical context-parallel attention (Megatron's `--cp-comm-type a2a+p2p` with
`--hierarchical-context-parallel-sizes A B`): Q, K and V are exchanged by all-to-all over
A consecutive ranks of the group (ppsim.executor.builders.ulysses), so each holds those
ranks' tokens for 1 / A of the heads, and K and V then pass round the ring of the B ranks
at the same place in each such group (ppsim.executor.builders.ring); the output is
exchanged back. As Transformer Engine's AttnFuncWithCPAndKVP2P with an all-to-all group,
a rank keeps the exchanged Q, K and V, the log-sum-exp and the output it returns (in its
own tokens' layout, exchanged to the heads again in the backward).
"""

from __future__ import annotations

from typing import Any

import torch

from ppsim.executor.builders.context import ContextGroup
from ppsim.executor.builders.ring import Ring, ring_backward, ring_forward
from ppsim.executor.builders.ulysses import heads_for_tokens, tokens_for_heads


class _HierarchicalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                heads: ContextGroup, ring: Ring) -> torch.Tensor:
        q, k, v = (heads_for_tokens(x, heads) for x in (q, k, v))
        out, lse = ring_forward(q, k, v, ring)
        out = tokens_for_heads(out, heads)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.heads, ctx.ring = heads, ring
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        out, grad = (heads_for_tokens(x, ctx.heads) for x in (out, grad))
        grads = ring_backward(q, k, v, out, lse, grad, ctx.ring)
        return (*(tokens_for_heads(x, ctx.heads) for x in grads), None, None)


def hierarchical_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           g: ContextGroup, places: list[torch.Tensor], window: int
                           ) -> torch.Tensor:
    """Causal attention (`window` > 0: sliding) of this rank's tokens' q (b, heads, s, d),
    k and v (b, kv_heads, s, d), rank r's tokens at the sequence `places[r]`: the heads
    exchanged over g.heads_group, K and V round g.ring_group."""
    heads, ring = g.heads_group, g.ring_group
    assert heads is not None and ring is not None
    span = heads.size  # the ring's member j holds the tokens of ranks j x span onwards
    held = [torch.cat(places[j * span:(j + 1) * span]) for j in range(ring.size)]
    return _HierarchicalAttention.apply(q, k, v, heads,
                                        Ring(ring, held[ring.rank], held, window))
