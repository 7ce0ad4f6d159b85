"""Grouped-query attention at tp above the key/value groups, as Megatron runs it
(SelfAttention.get_query_key_value_tensors; priced by ppsim.costs.kv_split).

One column-parallel linear holds the whole QKV width, its outputs laid out group by
group, "q1 q2 g1 g2 k1 v1 | q3 q4 g3 g4 k2 v2 | ..." (each group's query heads, their
output gates where the layer has them, its key head, its value head), split evenly over
the tensor ranks, so no weight is repeated and a rank's rows may cross a head; a bias
(the built-in GPT's Q and packed K, V have one, as Megatron's linear_qkv does) is laid
out and split row for row with the weight. Its output is all-gathered along the width
(all_gather_last_dim_from_tensor_parallel_region: the gradient reduce-scattered back),
and each rank slices its group, index tp_rank // (tp / groups), and of the group's query
heads (and gates) the heads / tp at index tp_rank % (tp / groups): it attends with those
over the group's one key/value head. The slices are copied out (Transformer Engine
copies the strided V; its norms and rotary make new Q and K), so nothing keeps the
gathered buffer once split: a rank keeps one key and value head, as ppsim.costs.saved
counts.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Rows:
    """A projection's output rows: its weight and its bias (None: it has none)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def part(self, start: int, stop: int) -> Rows:
        """Output rows start to stop, the bias's with the weight's."""
        return Rows(self.weight[start:stop],
                    None if self.bias is None else self.bias[start:stop])


def rows(linear: nn.Linear) -> Rows:
    """A linear's outputs as Rows (detached: they are copied into the fused linear)."""
    return Rows(linear.weight.detach(),
                None if linear.bias is None else linear.bias.detach())


def packed(linear: nn.Linear, parts: int) -> list[Rows]:
    """The Rows of `parts` equal projections one linear packs block after block (the
    built-in GPT's K then V)."""
    whole, n = rows(linear), linear.out_features // parts
    return [whole.part(i * n, (i + 1) * n) for i in range(parts)]


class GatheredQKV:
    """The layout and the split of one layer's interleaved QKV (the module docstring)."""

    def __init__(self, g: TensorGroup, heads: int, groups: int, head_dim: int,
                 gated: bool) -> None:
        self.g, self.heads, self.groups, self.head_dim = g, heads, groups, head_dim
        self.gated = gated
        self.per_group = heads // groups
        """Query heads of a group."""
        self.ranks_per_group = g.size // groups

    def fuse(self, q: Rows, k: Rows, v: Rows, gate: Rows | None) -> nn.Linear:
        """The whole projections' rows (and biases, where they have them: all or none)
        interleaved group by group into one linear, this rank's rows of it kept (a bias
        row with its weight row)."""
        hd, n = self.head_dim, self.per_group
        blocks: list[Rows] = []
        for i in range(self.groups):
            blocks += [q.part(i * n * hd, (i + 1) * n * hd),
                       *([gate.part(i * n * hd, (i + 1) * n * hd)] if gate is not None
                         else []),
                       k.part(i * hd, (i + 1) * hd), v.part(i * hd, (i + 1) * hd)]
        w = torch.cat([b.weight for b in blocks])
        biases = [b.bias for b in blocks if b.bias is not None]
        assert len(biases) in (0, len(blocks)), "some projections biased, some not"
        fused = nn.Linear(w.shape[1], w.shape[0], bias=bool(biases), device=w.device,
                          dtype=w.dtype)
        with torch.no_grad():
            fused.weight.copy_(w)
            if fused.bias is not None:
                fused.bias.copy_(torch.cat(biases))
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
