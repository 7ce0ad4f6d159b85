"""Rank groups in Megatron's default order, and which of them cross nodes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.presets import HARDWARE_PRESETS
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.job.ranks import (
    DIMS,
    TP_PP_DP_ORDER,
    Sizes,
    group_ranks,
    parse_order,
    pipeline_hops,
    pipeline_rank,
    span,
)
from ppsim.job.topology import network


def test_megatron_docstring_example() -> None:
    # megatron/core/parallel_state.py initialize_model_parallel's docstring: 16 GPUs, tp 2,
    # pp 4 (so dp 2): tp groups [g0, g1], dp groups [g0, g2], pp groups [g0, g4, g8, g12].
    s = Sizes(tp=2, dp=2, pp=4)
    assert group_ranks(s, ("tp",)) == [0, 1]
    assert group_ranks(s, ("dp",)) == [0, 2]
    assert group_ranks(s, ("pp",)) == [0, 4, 8, 12]


def test_405b_on_8192_gpus() -> None:
    s = Sizes(tp=8, dp=64, pp=16)
    tp = span(group_ranks(s, ("tp",)), 8)
    dp = span(group_ranks(s, ("dp",)), 8)
    assert (tp.nodes, tp.per_node) == (1, 8)
    assert (dp.nodes, dp.per_node) == (64, 1)
    assert pipeline_hops(s, 8) == [True] * 15


def test_small_pipeline_stays_in_a_node() -> None:
    assert pipeline_hops(Sizes(pp=4), 8) == [False] * 3
    assert pipeline_hops(Sizes(tp=2, dp=2, pp=4), 8) == [False, True, False]


def test_expert_groups_follow_tp() -> None:
    s = Sizes(tp=2, dp=8, ep=4, pp=1)
    assert group_ranks(s, ("ep",), experts=True) == [0, 2, 4, 6]
    # Another order moves dp inside: tp-dp-cp-ep-pp puts the dp group next to tp.
    assert group_ranks(s, ("dp",), "tp-dp-cp-ep-pp") == [0, 2, 4, 6, 8, 10, 12, 14]


def test_bad_order_is_refused() -> None:
    with pytest.raises(UserError, match="pipeline.rank_order"):
        parse_order("tp-dp-pp")
    with pytest.raises(UserError, match="pipeline.rank_order"):
        config_from_dict({"model": {"preset": "tiny-llm"},
                          "pipeline": {"rank_order": "tp-tp-cp-dp-pp"}})


def _hw(table: dict) -> object:
    return config_from_dict({"model": {"preset": "tiny-llm"}, "hardware": table}).hardware


def test_preset_topology_and_override() -> None:
    h = _hw({"preset": "h100-80gb"})
    net = network(h)
    assert (net.gpus_per_node, net.intra_bandwidth_gbps, net.inter_bandwidth_gbps) == (8, 450, 50)
    h = _hw({"preset": "h100-80gb", "gpus_per_node": 4, "inter_node_bandwidth_gbps": 25.0})
    assert (network(h).gpus_per_node, network(h).inter_bandwidth_gbps) == (4, 25.0)
    bare = network(_hw({"p2p_bandwidth_gbps": 7.0}))
    assert bare.intra_bandwidth_gbps == bare.inter_bandwidth_gbps == 7.0
    assert HARDWARE_PRESETS["a100-80gb"]["intra_node_bandwidth_gbps"] == 300.0


sizes = st.builds(Sizes, tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2]),
                  dp=st.sampled_from([1, 2, 3, 4, 8]), pp=st.sampled_from([1, 2, 4]))


@settings(max_examples=60, deadline=None)
@given(s=sizes, order=st.permutations(DIMS), gpn=st.sampled_from([1, 2, 4, 8, 16]),
       dim=st.sampled_from(["tp", "cp", "dp", "pp"]))
def test_groups_are_distinct_ranks_of_the_world(s: Sizes, order: list[str], gpn: int,
                                                dim: str) -> None:
    ranks = group_ranks(s, (dim,), "-".join(order))
    assert len(set(ranks)) == len(ranks) == getattr(s, dim)
    assert 0 <= min(ranks) and max(ranks) < s.gpus
    where = span(ranks, gpn)
    assert where.per_node * where.nodes <= where.size  # per_node: the thinnest node
    assert where.crosses_nodes == (len({r // gpn for r in ranks}) > 1)


def test_the_docstring_examples_pipeline_ranks() -> None:
    # the 16 GPUs above: pp groups [g0, g4, g8, g12], [g1, g5, g9, g13], ...
    s = Sizes(tp=2, dp=2, pp=4)
    assert [pipeline_rank(g, s) for g in range(16)] == [g // 4 for g in range(16)]


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.integers(1, 6),
       st.integers(1, 8), st.sampled_from(["tp-cp-ep-dp-pp", TP_PP_DP_ORDER]))
def test_each_rank_of_a_pipeline_group_holds_its_stage(tp, cp, dp, pp, order) -> None:
    """The ranks of rank 0's pipeline group, ascending, hold stages 0, 1, ..., pp - 1, and
    every rank holds one stage, each stage as many ranks."""
    s = Sizes(tp=tp, cp=cp, dp=dp, pp=pp)
    group = group_ranks(s, ("pp",), order)
    assert [pipeline_rank(g, s, order) for g in group] == list(range(pp))
    stages = [pipeline_rank(g, s, order) for g in range(s.gpus)]
    assert all(stages.count(r) == s.gpus // pp for r in range(pp))
