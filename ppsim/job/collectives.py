"""NCCL-like collective costs, as pure functions of a message size and a group's link.

Conventions are nccl-tests' (PERFORMANCE.md): a collective of n ranks moves its buffer
at the group's bus bandwidth B, a ring pays one latency per step. With S the buffer
(the gathered buffer for all-gather and reduce-scatter, all a rank sends for
all-to-all):

- ring all-reduce: 2(n-1) alpha + 2(n-1)/n S / B;
- tree all-reduce: 2 ceil(log2 n) alpha + 2(n-1)/n S / (B / 2): a double binary
  tree's reduce and broadcast share the same links, so ppsim takes half the ring's bus
  bandwidth for it (a modelling choice); the cheaper of ring and tree is used, so small
  buffers go by tree and large ones by ring, as NCCL's tuner does;
- all-gather, reduce-scatter: (n-1) alpha + (n-1)/n S / B;
- all-to-all: (n-1) alpha + the larger of the bytes that stay inside a node over the
  intra-node link and those that leave it over the rank's NIC.

A group inside one node runs at the NVLink figure; one that spans nodes runs its rings
through the NICs of the members on each node, k of them giving k NICs' bandwidth, never
more than NVLink's, k the fewest on any node it touches (Span.per_node).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppsim.costs.grouptimes import GroupTimes, TimedCollective
from ppsim.job.ranks import Span
from ppsim.job.topology import Network


@dataclass(frozen=True, kw_only=True)
class Link:
    """What a group's collectives run at."""

    size: int
    """Ranks in the group."""
    bus_bandwidth_gbps: float
    """Bus bandwidth of its rings, GB/s; 0: transfers are free."""
    latency_ms: float
    """One ring step."""
    per_node: int = 1
    """Members on one node (all-to-all keeps (per_node - 1) / size of its bytes inside)."""
    intra_bandwidth_gbps: float = 0.0
    """The node's own link, for what an all-to-all keeps inside a node."""
    inter_bandwidth_gbps: float = 0.0
    """One NIC, for what an all-to-all sends off the node."""
    timed: GroupTimes | None = None
    """The group's collectives as timed on it (a cost file's, ppsim.costs.grouptimes):
    each kind timed replaces its closed form."""

    def timed_as(self, kind: str) -> TimedCollective | None:
        """The line timed for `kind` (a GroupTimes field) on this group; None: the
        closed form prices it."""
        if self.timed is None or self.size <= 1:
            return None
        line: TimedCollective | None = getattr(self.timed, kind)
        return line


def link(net: Network, where: Span) -> Link:
    """The Link of a group placed as `where` on `net`."""
    if not where.crosses_nodes:
        bw, lat = net.intra_bandwidth_gbps, net.intra_latency_ms
    else:
        bw = min(net.intra_bandwidth_gbps, where.per_node * net.inter_bandwidth_gbps)
        lat = net.inter_latency_ms
    return Link(size=where.size, bus_bandwidth_gbps=bw, latency_ms=lat, per_node=where.per_node,
                intra_bandwidth_gbps=net.intra_bandwidth_gbps,
                inter_bandwidth_gbps=net.inter_bandwidth_gbps if where.crosses_nodes
                else net.intra_bandwidth_gbps)


def _wire(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e6) if gbps > 0 else 0.0


def ring_all_reduce_ms(nbytes: float, g: Link) -> float:
    n = g.size
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * g.latency_ms + _wire(2 * (n - 1) / n * nbytes, g.bus_bandwidth_gbps)


def tree_all_reduce_ms(nbytes: float, g: Link) -> float:
    n = g.size
    if n <= 1:
        return 0.0
    return (2 * math.ceil(math.log2(n)) * g.latency_ms
            + _wire(2 * (n - 1) / n * nbytes, g.bus_bandwidth_gbps / 2))


def all_reduce_ms(nbytes: float, g: Link) -> float:
    """The cheaper of ring and tree for this size (or as timed on the group)."""
    if (line := g.timed_as("all_reduce")) is not None:
        return line.ms(nbytes)
    return min(ring_all_reduce_ms(nbytes, g), tree_all_reduce_ms(nbytes, g))


def _gather_traffic_ms(nbytes: float, g: Link) -> float:
    """A ring's all-gather or reduce-scatter of `nbytes` in total: the same traffic."""
    n = g.size
    if n <= 1:
        return 0.0
    return (n - 1) * g.latency_ms + _wire((n - 1) / n * nbytes, g.bus_bandwidth_gbps)


def all_gather_ms(nbytes: float, g: Link) -> float:
    """All-gather of a buffer of `nbytes` in total (each rank contributes nbytes / n)."""
    if (line := g.timed_as("all_gather")) is not None:
        return line.ms(nbytes)
    return _gather_traffic_ms(nbytes, g)


def reduce_scatter_ms(nbytes: float, g: Link) -> float:
    """Reduce-scatter of a buffer of `nbytes` (each rank keeps nbytes / n)."""
    if (line := g.timed_as("reduce_scatter")) is not None:
        return line.ms(nbytes)
    return _gather_traffic_ms(nbytes, g)


def sharded_reduce_ms(nbytes: float, shard: Link, replica: Link) -> float:
    """Gradients of `nbytes` reduced into shards kept in several copies: reduce-scatter
    inside a copy, then each shard all-reduced across the copies (Megatron's partial
    distributed optimizer, torchtitan's HSDP)."""
    shards = max(1, shard.size)
    return reduce_scatter_ms(nbytes, shard) + all_reduce_ms(nbytes / shards, replica)


def all_to_all_ms(nbytes: float, g: Link) -> float:
    """All-to-all where each rank sends `nbytes` spread evenly over the group (its own
    share stays put)."""
    n = g.size
    if n <= 1:
        return 0.0
    if (line := g.timed_as("all_to_all")) is not None:
        return line.ms(nbytes)
    inside = _wire(nbytes * (g.per_node - 1) / n, g.intra_bandwidth_gbps)
    outside = _wire(nbytes * (n - g.per_node) / n, g.inter_bandwidth_gbps)
    return (n - 1) * g.latency_ms + max(inside, outside)


def spread(experts: int, top_k: int, shares: int) -> float:
    """Expected distinct shares (`shares` equal parts of the experts: ranks, or nodes) that
    one token's top_k experts fall in, drawn without replacement (an even router)."""
    per = experts / shares
    miss = 1.0  # probability that a given share holds none of them
    for i in range(top_k):
        miss *= max(0.0, experts - per - i) / (experts - i)
    return shares * (1 - miss)


def deepep_ms(token_bytes: float, g: Link, experts: int, top_k: int, shards: int = 1) -> float:
    """DeepEP's dispatch (or combine) of tokens of `token_bytes` in all, each routed to
    top_k of `experts` spread evenly over the expert-parallel group `g` (Megatron's flex
    dispatcher, deepseek-ai/DeepEP's normal kernels): a token crosses to each other node
    that holds one of its experts once, over the NIC, and reaches each GPU there over
    NVLink, where an all-to-all sends it once per expert. Megatron runs it over the etp x
    ep group, each expert in `shards` (etp) pieces on the GPUs of one expert
    tensor-parallel group: a token reaches every piece of its experts. (n - 1) alpha over
    the etp x ep ranks plus the longer of the NIC's and NVLink's bytes."""
    n = g.size * shards
    if n <= 1:
        return 0.0
    nodes = max(1, g.size // g.per_node)
    hit_node = spread(experts, top_k, nodes) / nodes  # a given node holds one of them
    gpus = spread(experts, top_k, g.size) / g.size  # a given GPU holds one of them
    remote = (nodes - 1) * hit_node  # copies over the NIC
    # Straight to the other GPUs of its node, and forwarded to those of each node reached.
    nvlink = (g.per_node * shards - 1) * gpus * (1 + remote / hit_node if hit_node else 1)
    return (n - 1) * g.latency_ms + max(_wire(token_bytes * nvlink, g.intra_bandwidth_gbps),
                                        _wire(token_bytes * remote, g.inter_bandwidth_gbps))


def unhidden_ms(comm_ms: float, window_ms: float, floor_ms: float = 0.0) -> float:
    """Of a collective of `comm_ms` run beside `window_ms` of compute, the part the
    window does not hide, never less than `floor_ms` (nor more than the whole)."""
    return min(comm_ms, max(floor_ms, comm_ms - window_ms))


def behind_compute_ms(comm_ms: float, window_ms: float, sm_share: float,
                      floor_ms: float = 0.0) -> float:
    """What a collective of `comm_ms` run beside `window_ms` of compute adds to it: the
    part the window does not hide (unhidden_ms), and for the part it hides the
    `sm_share` of the GPU's SMs its kernel holds from that compute."""
    exposed = unhidden_ms(comm_ms, window_ms, floor_ms)
    return exposed + sm_share * (comm_ms - exposed)


def send_ms(nbytes: float, g: Link) -> float:
    """One point-to-point message between neighbours of the group (a ring step)."""
    if g.size <= 1:
        return 0.0
    if (line := g.timed_as("send")) is not None:
        return line.ms(nbytes)
    bw = g.inter_bandwidth_gbps if g.per_node < g.size else g.intra_bandwidth_gbps
    return g.latency_ms + _wire(nbytes, bw)
