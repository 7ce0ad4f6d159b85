"""Context-parallel attention by all-to-all (DeepSpeed-Ulysses; Megatron's `--cp-comm-type
a2a`, Transformer Engine's AttnFuncWithCPAndQKVOA2A): Q, K and V are exchanged so each
rank holds every token of 1 / cp of the heads, it attends over the whole sequence, and its
output is exchanged back to its own tokens of every head; in the backward the output's
gradient goes to the heads and Q's, K's and V's come back. cp must divide the query and
key/value heads a rank holds (ppsim.config refuses it otherwise, as Transformer Engine
asserts).

A rank keeps its own tokens' Q, K and V for the backward, which exchanges them again and
attends once more to take the gradients (no kernel that every device has takes a saved
log-sum-exp): three exchanges and one forward of the core more than Transformer
Engine's, and no attention output or log-sum-exp kept.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.context import ContextGroup, masked_attention, visible


def heads_for_tokens(x: torch.Tensor, g: ContextGroup) -> torch.Tensor:
    """(b, heads, s, d) of this rank's tokens -> (b, heads / cp, cp x s, d): every rank's
    tokens (in rank order) of this rank's share of the heads."""
    b, heads, s, d = x.shape
    send = x.reshape(b, g.size, heads // g.size, s, d).transpose(0, 1).contiguous()
    got = torch.empty_like(send)
    with timed("cp"):
        dist.all_to_all_single(got, send, group=g.group)
    return got.permute(1, 2, 0, 3, 4).reshape(b, heads // g.size, g.size * s, d)


def tokens_for_heads(y: torch.Tensor, g: ContextGroup) -> torch.Tensor:
    """The inverse: (b, heads / cp, cp x s, d) -> (b, heads, s, d) of this rank's tokens,
    laid out (b, s, heads, d) as FlashAttention's output is (the projection reads it as
    it is)."""
    b, share, every, d = y.shape
    s = every // g.size
    send = y.reshape(b, share, g.size, s, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(send)
    with timed("cp"):
        dist.all_to_all_single(got, send, group=g.group)
    return got.permute(1, 3, 0, 2, 4).reshape(b, s, g.size * share, d).transpose(1, 2)


class _ExchangedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: ContextGroup, seen: torch.Tensor) -> torch.Tensor:
        ctx.g, ctx.seen = g, seen
        ctx.save_for_backward(q, k, v)
        out = masked_attention(*(heads_for_tokens(x, g) for x in (q, k, v)), seen)
        return tokens_for_heads(out, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        g = ctx.g
        heads = [heads_for_tokens(x, g) for x in ctx.saved_tensors]
        with torch.enable_grad():
            heads = [x.detach().requires_grad_() for x in heads]
            out = masked_attention(*heads, ctx.seen)
            grads = torch.autograd.grad(out, heads, heads_for_tokens(grad, g))
        return (*(tokens_for_heads(x, g) for x in grads), None, None)



def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: ContextGroup,
                      places: list[torch.Tensor], window: int) -> torch.Tensor:
    """Causal attention (`window` > 0: sliding) of this rank's tokens' q (b, heads, s, d),
    k and v (b, kv_heads, s, d), rank r's tokens at the sequence `places[r]`, through
    1 / cp of the heads over the whole sequence."""
    every = torch.cat(places)
    return _ExchangedAttention.apply(q, k, v, g, visible(every, every, window))
