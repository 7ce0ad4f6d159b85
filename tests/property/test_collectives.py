"""Each collective's cost against its closed form (nccl-tests PERFORMANCE.md conventions),
on random sizes and topologies."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.job.collectives import (
    Link,
    all_gather_ms,
    all_reduce_ms,
    all_to_all_ms,
    link,
    reduce_scatter_ms,
    ring_all_reduce_ms,
    tree_all_reduce_ms,
)
from ppsim.job.ranks import Span
from ppsim.job.topology import Network

sizes = st.floats(min_value=1.0, max_value=1e11, allow_nan=False)
ranks = st.integers(min_value=2, max_value=4096)
gbps = st.floats(min_value=1.0, max_value=1000.0)
lat = st.floats(min_value=0.0, max_value=0.05)
links = st.builds(Link, size=ranks, bus_bandwidth_gbps=gbps, latency_ms=lat)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=80, deadline=None)
@given(s=sizes, g=links)
def test_ring_all_reduce_bus_bandwidth(s: float, g: Link) -> None:
    # nccl-tests: busbw = algbw x 2(n-1)/n; with no latency the ring runs at the bus bandwidth.
    n = g.size
    no_latency = Link(size=n, bus_bandwidth_gbps=g.bus_bandwidth_gbps, latency_ms=0.0)
    algbw = s / (ring_all_reduce_ms(s, no_latency) * 1e6)
    assert close(algbw * 2 * (n - 1) / n, g.bus_bandwidth_gbps)
    expect = 2 * (n - 1) * g.latency_ms + 2 * (n - 1) / n * s / (g.bus_bandwidth_gbps * 1e6)
    assert close(ring_all_reduce_ms(s, g), expect)


@settings(max_examples=80, deadline=None)
@given(s=sizes, g=links)
def test_all_reduce_takes_the_cheaper_algorithm(s: float, g: Link) -> None:
    n, bw = g.size, g.bus_bandwidth_gbps
    tree = 2 * math.ceil(math.log2(n)) * g.latency_ms + 2 * (n - 1) / n * s / (bw / 2 * 1e6)
    assert close(tree_all_reduce_ms(s, g), tree)
    assert close(all_reduce_ms(s, g), min(tree, ring_all_reduce_ms(s, g)))


def test_small_buffers_go_by_tree_large_by_ring() -> None:
    g = Link(size=512, bus_bandwidth_gbps=50.0, latency_ms=0.005)
    assert all_reduce_ms(1e3, g) == tree_all_reduce_ms(1e3, g) < ring_all_reduce_ms(1e3, g)
    assert all_reduce_ms(1e10, g) == ring_all_reduce_ms(1e10, g) < tree_all_reduce_ms(1e10, g)


@settings(max_examples=80, deadline=None)
@given(s=sizes, g=links)
def test_all_gather_and_reduce_scatter(s: float, g: Link) -> None:
    # busbw = algbw x (n-1)/n, with S the gathered buffer.
    n = g.size
    expect = (n - 1) * g.latency_ms + (n - 1) / n * s / (g.bus_bandwidth_gbps * 1e6)
    assert close(all_gather_ms(s, g), expect)
    assert close(reduce_scatter_ms(s, g), expect)


@settings(max_examples=80, deadline=None)
@given(s=sizes, gpn=st.sampled_from([1, 2, 4, 8]), nodes=st.integers(1, 64),
       intra=gbps, inter=gbps, a=lat, b=lat)
def test_group_links_and_all_to_all(s: float, gpn: int, nodes: int, intra: float,
                                    inter: float, a: float, b: float) -> None:
    net = Network(gpus_per_node=gpn, intra_bandwidth_gbps=intra, intra_latency_ms=a,
                  inter_bandwidth_gbps=inter, inter_latency_ms=b)
    n = gpn * nodes
    if n < 2:
        return
    g = link(net, Span(size=n, per_node=gpn, nodes=nodes))
    if nodes == 1:
        assert (g.bus_bandwidth_gbps, g.latency_ms) == (intra, a)
        expect = (n - 1) * a + s * (n - 1) / n / (intra * 1e6)
    else:
        assert (g.bus_bandwidth_gbps, g.latency_ms) == (min(intra, gpn * inter), b)
        expect = (n - 1) * b + max(s * (gpn - 1) / n / (intra * 1e6),
                                   s * (n - gpn) / n / (inter * 1e6))
    assert close(all_to_all_ms(s, g), expect)


def test_one_rank_costs_nothing() -> None:
    g = Link(size=1, bus_bandwidth_gbps=1.0, latency_ms=1.0)
    assert all_reduce_ms(1e9, g) == all_gather_ms(1e9, g) == all_to_all_ms(1e9, g) == 0.0
