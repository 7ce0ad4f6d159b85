"""The attention of a context-parallel rank (ppsim.executor.builders.context) by the
group's traffic, Megatron's --cp-comm-type: p2p (K and V round a ring,
ppsim.executor.builders.ring), all_gather (ppsim.executor.builders.kv_gather), a2a (the
heads exchanged, ppsim.executor.builders.ulysses) or both at once, a2a+p2p
(ppsim.executor.builders.hierarchical)."""

from __future__ import annotations

import torch

from ppsim.executor.builders.context import chunk_positions, context
from ppsim.executor.builders.hierarchical import hierarchical_attention
from ppsim.executor.builders.kv_gather import gathered_attention
from ppsim.executor.builders.ring import ring_attention
from ppsim.executor.builders.ulysses import ulysses_attention

ATTENTION = {"p2p": ring_attention, "all_gather": gathered_attention,
             "a2a": ulysses_attention, "a2a+p2p": hierarchical_attention}
"""Each traffic's attention."""


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int
                      ) -> torch.Tensor:
    """Causal attention (a `window` > 0: sliding) of this rank's queries q (b, heads, s, d)
    against every context-parallel rank's k and v (b, kv_heads, s, d), the fused core's
    (Megatron's unfused one takes no context parallelism, ppsim.config refuses it)."""
    g = context()
    assert g is not None
    seq = q.shape[2] * g.size
    places = [chunk_positions(seq, g.size, r).to(q.device) for r in range(g.size)]
    window = window if 0 < window < seq - 1 else 0  # one that covers the sequence: none
    return ATTENTION[g.comm](q, k, v, g, places, window)
