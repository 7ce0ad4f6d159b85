"""Megatron's expert order over a pipeline rank's tp x dp places (MoE parallel folding)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.executor.places import expert_places, group_of


@st.composite
def _shapes(draw: st.DrawFn) -> tuple[int, int, int, int]:
    tp, dp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.integers(1, 12))
    etp = draw(st.sampled_from([d for d in range(1, tp * dp + 1) if tp * dp % d == 0]))
    ep = draw(st.sampled_from([d for d in range(1, tp * dp + 1) if tp * dp % (d * etp) == 0]))
    return tp, dp, ep, etp


@given(_shapes())
def test_every_place_is_in_one_group_of_each_kind(shape) -> None:
    tp, dp, ep, etp = shape
    places = expert_places(tp, dp, ep, etp)
    for groups, size in ((places.tensor_groups, etp), (places.expert_groups, ep),
                         (places.replica_groups, tp * dp // (ep * etp))):
        assert all(len(g) == size for g in groups)
        assert sorted(q for g in groups for q in g) == list(range(tp * dp))


@given(_shapes())
def test_the_ranks_that_exchange_or_reduce_hold_the_same_slice(shape) -> None:
    """A rank holds slice q % etp of each of its experts (its expert tensor group is etp
    consecutive places): every rank it exchanges pairs with, and every rank it reduces
    their gradients with, holds the same slice; at etp = tp that is its tensor rank, and
    at etp 1 an expert group is ep consecutive places."""
    tp, dp, ep, etp = shape
    places = expert_places(tp, dp, ep, etp)
    for g in places.expert_groups + places.replica_groups:
        assert len({q % etp for q in g}) == 1, g
    for g in places.tensor_groups:
        assert sorted(q % etp for q in g) == list(range(etp)), g
    if etp == 1:
        assert all(g == list(range(g[0], g[0] + ep)) for g in places.expert_groups)


def test_an_expert_group_and_a_replica_group_meet_in_one_place() -> None:
    """tp 2 x dp 4, ep 2, etp 2: place 5 (replica 2, tensor rank 1) exchanges pairs with
    place 7 (replica 3) and holds the experts place 1 (replica 0) holds."""
    places = expert_places(2, 4, 2, 2)
    assert places.expert_groups[group_of(places.expert_groups, 5)] == [5, 7]
    assert places.replica_groups[group_of(places.replica_groups, 5)] == [1, 5]
    assert places.tensor_groups[group_of(places.tensor_groups, 5)] == [4, 5]


@pytest.mark.parametrize("tp, dp, ep, etp, words", [
    (2, 3, 2, 2, "etp x ep = 4 does not divide tp x dp = 6"),
    (4, 1, 1, 3, "etp x ep = 3 does not divide tp x dp = 4"),
])
def test_a_layout_that_does_not_fold_is_refused(tp, dp, ep, etp, words) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        expert_places(tp, dp, ep, etp)
