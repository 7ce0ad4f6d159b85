"""Global ranks of a job and the groups each collective runs over, as Megatron lays them out.

Megatron's RankGenerator (megatron/core/parallel_state.py) numbers ranks by an order of
dimensions, innermost first; the default "tp-cp-ep-dp-pp" puts tensor parallelism inside
a node and the pipeline outermost. Attention and dense weights see the world as
tp x cp x dp x pp (ep plays no part); experts see it as etp x ep x edp x pp, in the same
order, with etp the expert tensor-parallel size (tp by default) and edp = tp x cp x dp /
(etp x ep) (MoE parallel folding: expert groups may span the attention's tp ranks). A
group is the set of ranks that differ only in its dimensions; what it costs depends on
how many of its members share a node (ppsim.job.collectives). The groups of one kind are
translates of rank 0's, and where gpus_per_node is not a power of two (72 on GB200
NVL72) or a size is not, they fall on nodes differently: the job waits for the worst
placed of them, so each kind is priced at that one (worst_span).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ppsim.costs.experts import expert_data_parallel
from ppsim.errors import UserError

DIMS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""Megatron's rank order, innermost first."""
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"
"""The order Megatron's --use-tp-pp-dp-mapping selects (megatron/training/initialize.py);
no other order can be given to Megatron."""


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The job's parallel sizes."""

    tp: int = 1
    """Tensor-parallel size."""
    cp: int = 1
    """Context-parallel size."""
    ep: int = 1
    """Expert-parallel size; etp x ep carved out of tp x cp x dp, as Megatron's expert
    groups are."""
    dp: int = 1
    """Data-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    etp: int = 0
    """Expert tensor-parallel size (0: tp)."""

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.dp * self.pp


@dataclass(frozen=True, kw_only=True)
class Span:
    """Where one group's members sit."""

    size: int
    """Ranks in the group."""
    per_node: int
    """Fewest members on a node the group touches: that node's NICs carry all the
    group's traffic in and out of it, so they bound its rings and all-to-alls."""
    nodes: int
    """Nodes the group touches."""

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def parse_order(order: str) -> tuple[str, ...]:
    """The dimensions of a --rank-order string, innermost first; UserError otherwise."""
    dims = tuple(d.strip() for d in order.split("-"))
    if sorted(dims) != sorted(DIMS):
        raise UserError("pipeline.rank_order", f"{order!r} is not an order of "
                        + ", ".join(DIMS), f"write each once, e.g. {DEFAULT_ORDER!r}")
    return dims


def _strides(sizes: dict[str, int], order: tuple[str, ...]) -> dict[str, int]:
    stride, out = 1, {}
    for d in order:
        out[d] = stride
        stride *= sizes[d]
    return out


def world_sizes(s: Sizes, experts: bool) -> dict[str, int]:
    """Sizes per dimension of the dense world, or (experts) of the expert world, whose
    tensor-parallel dimension is etp and data-parallel one what tp x cp x dp leaves after
    etp x ep."""
    if experts:
        edp = expert_data_parallel(s.tp, s.cp, s.dp, s.expert_tp, s.ep)
        return {"tp": s.expert_tp, "cp": 1, "ep": s.ep, "dp": edp, "pp": s.pp}
    return {"tp": s.tp, "cp": s.cp, "ep": 1, "dp": s.dp, "pp": s.pp}


def group_ranks(s: Sizes, dims: tuple[str, ...], order: str = DEFAULT_ORDER,
                experts: bool = False) -> list[int]:
    """Global ranks of the group over `dims` that holds rank 0, ascending."""
    sizes = world_sizes(s, experts)
    strides = _strides(sizes, parse_order(order))
    ranks = [0]
    for d in dims:
        ranks = [r + k * strides[d] for r in ranks for k in range(sizes[d])]
    return sorted(ranks)


def pipeline_rank(rank: int, s: Sizes, order: str = DEFAULT_ORDER) -> int:
    """The pipeline rank a global rank holds."""
    sizes = world_sizes(s, experts=False)
    return rank // _strides(sizes, parse_order(order))["pp"] % s.pp


def span(ranks: list[int], gpus_per_node: int) -> Span:
    """How a group's ranks fall on nodes of `gpus_per_node` GPUs."""
    per: dict[int, int] = {}
    for r in ranks:
        per[r // gpus_per_node] = per.get(r // gpus_per_node, 0) + 1
    return Span(size=len(ranks), per_node=min(per.values()), nodes=len(per))


def worst_span(groups: Iterable[list[int]], gpus_per_node: int) -> Span:
    """The span of the slowest of `groups`: one crossing nodes before any inside one, then
    the fewest members on a node, then the most nodes."""
    spans = [span(g, gpus_per_node) for g in groups]
    return max(spans, key=lambda w: (w.crosses_nodes, -w.per_node, w.nodes))


def translates(s: Sizes, dims: tuple[str, ...], gpus_per_node: int,
               order: str = DEFAULT_ORDER, experts: bool = False) -> list[list[int]]:
    """The groups over `dims`, one for each way they fall on nodes: rank 0's group moved
    to each origin (a rank whose coordinates in `dims` are 0), origins alike modulo
    gpus_per_node kept once, since rank o + x sits on node o // g + (o % g + x) // g."""
    sizes = world_sizes(s, experts)
    strides = _strides(sizes, parse_order(order))
    found = {0: 0}  # origin modulo gpus_per_node -> one such origin
    for d in parse_order(order):
        if d not in dims:
            found = {(o + k * strides[d]) % gpus_per_node: o + k * strides[d]
                     for o in found.values() for k in range(sizes[d])}
    base = group_ranks(s, dims, order, experts)
    return [[o + r for r in base] for o in sorted(found.values())]


def split_spans(groups: list[list[int]], inner: int, gpus_per_node: int
                ) -> tuple[Span, Span]:
    """The worst spans of the groups' blocks of `inner` consecutive members and of the
    groups across those blocks (every inner-th member)."""
    inner = max(1, inner)
    blocks = [g[j:j + inner] for g in groups for j in range(0, len(g), inner)]
    across = [g[j::inner] for g in groups for j in range(min(inner, len(g)))]
    return worst_span(blocks, gpus_per_node), worst_span(across, gpus_per_node)


def pipeline_hops(s: Sizes, gpus_per_node: int, order: str = DEFAULT_ORDER) -> list[bool]:
    """For each pipeline boundary (stage i to i + 1): does it cross nodes in any
    replica?"""
    hops = [False] * (s.pp - 1)
    for ranks in translates(s, ("pp",), gpus_per_node, order):
        for i, (a, b) in enumerate(zip(ranks, ranks[1:], strict=False)):
            hops[i] = hops[i] or a // gpus_per_node != b // gpus_per_node
    return hops
