"""Context-parallel attention by a ring of K/V passes (Megatron's default `--cp-comm-type
p2p`, Transformer Engine's AttnFuncWithCPAndKVP2P): each rank attends to its own K and V,
then to each other rank's as they come round the ring, sending the block it holds on
while it computes; the partial results merge by their log-sum-exp, as FlashAttention
merges its tiles. The backward passes the blocks round again, each with the gradients of
its K and V accumulating as it goes, and after one more pass they are home.

A rank keeps its queries, its own K and V, the output and the log-sum-exp for the
backward, as FlashAttention does; the blocks in flight are transient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.context import ContextGroup, visible


@dataclass
class _Pass:
    """One pass round the ring in flight: this rank's blocks sent to the next rank, the
    previous rank's arriving in `incoming` (shaped as `blocks`)."""

    incoming: torch.Tensor
    works: list[Any]
    blocks: list[torch.Tensor]

    def arrived(self) -> list[torch.Tensor]:
        """The previous rank's blocks, once here."""
        with timed("cp"):  # what the pass was not hidden by
            for work in self.works:
                work.wait()
        out, at = [], 0
        for b in self.blocks:
            out.append(self.incoming[at:at + b.numel()].view_as(b))
            at += b.numel()
        return out


def ring_pass(block: torch.Tensor, g: ContextGroup) -> torch.Tensor:
    """One pass of `block` round the ring: the previous rank's, once here."""
    return _passed_on([block], g).arrived()[0]


def _passed_on(blocks: list[torch.Tensor], g: ContextGroup) -> _Pass:
    """Send `blocks` to the next rank of the ring and receive the previous rank's, both
    started in one batch (NCCL pairs them; two ranks send to each other at once)."""
    nxt = dist.get_global_rank(g.group, (g.rank + 1) % g.size)
    prev = dist.get_global_rank(g.group, (g.rank - 1) % g.size)
    flat = torch.cat([b.reshape(-1) for b in blocks])
    incoming = torch.empty_like(flat)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, flat, nxt, g.group),
                                    dist.P2POp(dist.irecv, incoming, prev, g.group)])
    return _Pass(incoming, works, blocks)


def _expanded(x: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V repeated to each query head of its group (grouped-query attention)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A per-query-head gradient summed back to its key/value head."""
    b, heads, s, d = x.shape
    return x if heads == kv_heads else x.view(b, kv_heads, heads // kv_heads, s, d).sum(2)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """`x` in the precision the merge runs in: fp32, or wider where `x` is."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _scores(q: torch.Tensor, k: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    s = torch.matmul(_wide(q), _wide(_expanded(k, q.shape[1])).transpose(-2, -1))
    return (s * q.shape[-1] ** -0.5).masked_fill(~seen, float("-inf"))


@dataclass(frozen=True)
class Ring:
    """Where a rank's queries sit and whose K and V come round: the group, this rank's
    places in the sequence, every member's (`places[r]`), and the sliding window (0:
    none)."""

    group: ContextGroup
    mine: torch.Tensor
    places: list[torch.Tensor]
    window: int

    def seen(self, step: int) -> torch.Tensor:
        """Which keys of the block at `step` (member rank - step's) the queries see."""
        g = self.group
        return visible(self.mine, self.places[(g.rank - step) % g.size], self.window)


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The output, laid out (b, s, heads, d) as FlashAttention's is (the projection reads
    it as it is, one tensor kept for both), and the log-sum-exp of each query."""
    b, heads, s, _ = q.shape
    wide = _wide(q).dtype
    peak = q.new_full((b, heads, s), float("-inf"), dtype=wide)
    total = torch.zeros_like(peak)
    acc = q.new_zeros((b, heads, s, v.shape[-1]), dtype=wide)
    block, size = [k, v], ring.group.size
    for i in range(size):
        pending = _passed_on(block, ring.group) if i < size - 1 else None
        scores = _scores(q, block[0], ring.seen(i))
        new_peak = torch.maximum(peak, scores.amax(-1))
        base = torch.where(new_peak.isinf(), 0.0, new_peak)
        scale = torch.exp(peak - base)
        p = torch.exp(scores - base[..., None])
        total = total * scale + p.sum(-1)
        acc = acc * scale[..., None] + p @ _wide(_expanded(block[1], heads))
        peak = new_peak
        if pending is not None:
            block = pending.arrived()
    out = acc.new_empty((b, s, heads, acc.shape[-1]), dtype=q.dtype).transpose(1, 2)
    out.copy_(acc / total[..., None])
    return out, peak + total.log()


def ring_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, grad: torch.Tensor, ring: Ring
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of q, k and v: the blocks round again, each with its K and V
    gradients accumulating; after the last block only the gradients, which then are
    home."""
    heads, g = q.shape[1], ring.group
    dout = _wide(grad)
    delta = (dout * _wide(out)).sum(-1, keepdim=True)
    dq = torch.zeros_like(q, dtype=dout.dtype)
    block = [k, v, torch.zeros_like(k, dtype=dout.dtype), torch.zeros_like(v, dtype=dout.dtype)]
    for i in range(g.size):
        blk_k, blk_v, dk, dv = block
        p = torch.exp(_scores(q, blk_k, ring.seen(i)) - lse[..., None])
        dv = dv + _grouped(p.transpose(-2, -1) @ dout, k.shape[1])
        ds = p * (dout @ _wide(_expanded(blk_v, heads)).transpose(-2, -1) - delta)
        ds = ds * q.shape[-1] ** -0.5
        dq += ds @ _wide(_expanded(blk_k, heads))
        dk = dk + _grouped(ds.transpose(-2, -1) @ _wide(q), k.shape[1])
        last = i == g.size - 1
        block = _passed_on([dk, dv] if last else [blk_k, blk_v, dk, dv], g).arrived()
    dk, dv = block[-2:]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ring: Ring) -> torch.Tensor:
        out, lse = ring_forward(q, k, v, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (*ring_backward(*ctx.saved_tensors, grad, ctx.ring), None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: ContextGroup,
                   places: list[torch.Tensor], window: int) -> torch.Tensor:
    """Causal attention (`window` > 0: sliding) of this rank's queries q (b, heads, s, d)
    against every rank's k and v (b, kv_heads, s, d), rank r's tokens at the sequence
    `places[r]`, passed round the ring."""
    return _RingAttention.apply(q, k, v, Ring(g, places[g.rank], places, window))
