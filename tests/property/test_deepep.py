"""DeepEP's dispatch (Megatron's flex dispatcher) against its definition: a token crosses
to each other node holding one of its experts once and reaches each GPU there over
NVLink; an all-to-all sends one copy per expert."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.job.collectives import Link, all_to_all_ms, deepep_ms, link, spread
from ppsim.job.ranks import Span
from ppsim.job.topology import Network


@st.composite
def routings(draw) -> tuple[int, int, int]:
    """(experts, top_k, shares): the shares split the experts evenly."""
    shares = draw(st.integers(1, 4))
    experts = shares * draw(st.integers(1, 3))
    return experts, draw(st.integers(1, experts)), shares


@settings(max_examples=60, deadline=None)
@given(routings())
def test_spread_is_the_mean_over_every_choice_of_experts(r) -> None:
    experts, k, shares = r
    per = experts // shares
    choices = list(itertools.combinations(range(experts), k))
    mean = sum(len({e // per for e in c}) for c in choices) / len(choices)
    assert math.isclose(spread(experts, k, shares), mean, rel_tol=1e-12)


def group(size: int, per_node: int) -> Link:
    net = Network(gpus_per_node=per_node, intra_bandwidth_gbps=450.0, intra_latency_ms=1e-3,
                  inter_bandwidth_gbps=50.0, inter_latency_ms=5e-3)
    return link(net, Span(size=size, per_node=per_node, nodes=size // per_node))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.sampled_from([1, 2, 4, 8]), st.integers(1, 8),
       st.floats(1e3, 1e9))
def test_deepep_never_moves_more_than_an_all_to_all_off_the_node(per_node, nodes, k,
                                                                   token_bytes) -> None:
    n = per_node * nodes
    experts = 8 * n
    g = group(n, per_node)
    ours, theirs = deepep_ms(token_bytes, g, experts, k), all_to_all_ms(token_bytes * k, g)
    if nodes == 1:
        assert ours <= theirs * (1 + 1e-12)
    # Across nodes the NIC carries at most one copy a node, never more than one an expert.
    remote = (nodes - 1) * spread(experts, k, nodes) / nodes
    assert remote <= k * (n - per_node) / n + 1e-12


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.floats(1e3, 1e9))
def test_one_expert_a_token_inside_a_node_is_an_all_to_all(n, token_bytes) -> None:
    g = group(n, n)
    assert math.isclose(deepep_ms(token_bytes, g, 4 * n, 1), all_to_all_ms(token_bytes, g),
                        rel_tol=1e-12)
