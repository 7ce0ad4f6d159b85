"""Grouped-query attention at tp above the key/value groups, as Megatron runs it
(SelfAttention.get_query_key_value_tensors; priced by ppsim.costs.kv_split).

One column-parallel linear holds the whole QKV width, its outputs laid out group by
group, "q1 q2 g1 g2 k1 v1 | q3 q4 g3 g4 k2 v2 | ..." (each group's query heads, their
output gates where the layer has them, its key head, its value head), split evenly over
the tensor ranks, so no weight is repeated and a rank's rows may cross a head. Its output
is all-gathered along the width (all_gather_last_dim_from_tensor_parallel_region: the
gradient reduce-scattered back), and each rank slices its group, index tp_rank // (tp /
groups), and of the group's query heads (and gates) the heads / tp at index tp_rank % (tp
/ groups): it attends with those over the group's one key/value head. The slices are
copied out (Transformer Engine copies the strided V; its norms and rotary make new Q
and K), so nothing keeps the gathered buffer once split: a rank keeps one key and value
head, as ppsim.costs.saved counts.
"""

from __future__ import annotations

import torch
from torch import nn

from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.tensor import (
    ALL_GATHER,
    REDUCE_SCATTER,
    TensorGroup,
    exchanged,
    shard_output,
)


def gathers(groups: int, g: TensorGroup) -> bool:
    """Megatron gathers the QKV output: more tensor ranks than key/value groups."""
    return g.size > groups


def _gathered_width(y: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """Every rank's columns (the last dimension), in rank order."""
    local = y.movedim(-1, 0).contiguous()  # the collective runs along dimension 0
    out = local.new_empty((local.shape[0] * g.size, *local.shape[1:]))
    with timed("tp"):
        ALL_GATHER(out, local, group=g.group)
    return out.movedim(0, -1)


def _scattered_width(grad: torch.Tensor, g: TensorGroup) -> torch.Tensor:
    """The sum over the ranks of this rank's columns (the last dimension)."""
    whole = grad.movedim(-1, 0).contiguous()
    out = whole.new_empty((whole.shape[0] // g.size, *whole.shape[1:]))
    with timed("tp"):
        REDUCE_SCATTER(out, whole, group=g.group)
    return out.movedim(0, -1).contiguous()


class GatheredQKV:
    """The layout and the split of one layer's interleaved QKV (the module docstring)."""

    def __init__(self, g: TensorGroup, heads: int, groups: int, head_dim: int,
                 gated: bool) -> None:
        self.g, self.heads, self.groups, self.head_dim = g, heads, groups, head_dim
        self.gated = gated
        self.per_group = heads // groups
        """Query heads of a group."""
        self.ranks_per_group = g.size // groups

    def fuse(self, q: nn.Linear, k: nn.Linear, v: nn.Linear,
             gate: nn.Linear | None) -> nn.Linear:
        """The whole projections' weights interleaved group by group into one linear
        (no bias: the shipped decoder's have none), this rank's rows of it kept."""
        hd, n = self.head_dim, self.per_group

        def rows(lin: nn.Linear, i: int, heads: int) -> torch.Tensor:
            return lin.weight.detach()[i * heads * hd:(i + 1) * heads * hd]

        blocks = []
        for i in range(self.groups):
            blocks += [rows(q, i, n), *([rows(gate, i, n)] if gate is not None else []),
                       rows(k, i, 1), rows(v, i, 1)]
        w = torch.cat(blocks)
        fused = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device,
                          dtype=w.dtype)
        with torch.no_grad():
            fused.weight.copy_(w)
        shard_output(fused, self.g)
        return fused

    def split(self, y: torch.Tensor) -> list[torch.Tensor]:
        """This rank's columns of the fused output (b, s, width / tp), gathered, as its
        query heads, key head, value head and gates (b, s, n x head_dim each): q, k, v
        and the gate, in the order the layer's separate projections give them."""
        whole = exchanged(y, self.g, _gathered_width, _scattered_width)
        b, t, width = whole.shape
        size = width // self.groups
        group = self.g.rank // self.ranks_per_group
        mine = whole[..., group * size:(group + 1) * size]
        hd, n = self.head_dim, self.per_group
        widths = [n * hd, *([n * hd] if self.gated else []), hd, hd]
        parts = list(mine.split(widths, -1))
        own = self.heads // self.g.size  # of the group's query heads (and gates)
        j = self.g.rank % self.ranks_per_group

        def heads_of(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, t, n, hd)[:, :, j * own:(j + 1) * own].reshape(b, t, own * hd)

        q, gate = heads_of(parts[0]), heads_of(parts[1]) if self.gated else None
        k, v = parts[-2], parts[-1]
        # copies: the gathered buffer is freed once split (the module docstring)
        return [x.contiguous() for x in (q, k, v, gate) if x is not None]
