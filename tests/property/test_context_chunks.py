"""Megatron's causal load balancing as the executor cuts the sequence
(ppsim.executor.builders.context): the ranks' tokens are the sequence once over, each
rank has the same causal work, and a query sees the keys the one-process mask lets it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from ppsim.executor.builders.context import (  # noqa: E402
    ContextGroup,
    chunk_positions,
    own_tokens,
    set_context,
    token_positions,
    visible,
)
from ppsim.executor.builders.stage import window_mask  # noqa: E402
from ppsim.executor.builders.tensor import message_shape  # noqa: E402


@given(cp=st.integers(1, 8), chunk=st.integers(1, 16))
def test_the_ranks_hold_the_sequence_once_with_equal_causal_work(cp: int, chunk: int) -> None:
    seq = 2 * cp * chunk
    ranks = [chunk_positions(seq, cp, r).tolist() for r in range(cp)]
    assert sorted(p for r in ranks for p in r) == list(range(seq))
    # a query at place p attends to p + 1 keys: every rank the same sum
    assert len({sum(p + 1 for p in r) for r in ranks}) == 1
    # rank r: chunks r and 2cp - 1 - r, each in order
    assert ranks[0][:chunk] == list(range(chunk))
    assert ranks[0][chunk:] == list(range(seq - chunk, seq))


@given(cp=st.integers(2, 6), seq=st.integers(2, 64))
def test_a_sequence_that_does_not_cut_is_refused(cp: int, seq: int) -> None:
    if seq % (2 * cp) == 0:
        return
    with pytest.raises(ValueError, match="2 x cp"):
        chunk_positions(seq, cp, 0)


@given(cp=st.integers(1, 4), chunk=st.integers(1, 6), window=st.integers(0, 30),
       rank=st.integers(0, 3))
def test_a_query_sees_what_the_whole_sequence_mask_lets_it(cp: int, chunk: int, window: int,
                                                          rank: int) -> None:
    seq = 2 * cp * chunk
    mine = chunk_positions(seq, cp, rank % cp)
    every = torch.cat([chunk_positions(seq, cp, r) for r in range(cp)])
    w = window if 0 < window < seq - 1 else 0
    mask = window_mask(seq, w if w else seq, torch.float32, torch.device("cpu")) == 0
    assert torch.equal(visible(mine, every, w), mask[mine][:, every])


@given(cp=st.integers(1, 4), chunk=st.integers(1, 6), rank=st.integers(0, 3))
def test_a_rank_reads_its_tokens_and_sends_its_share(cp: int, chunk: int, rank: int) -> None:
    seq, rank = 2 * cp * chunk, rank % cp
    ids = torch.arange(3 * seq).view(3, seq)
    try:
        set_context(ContextGroup(group=None, rank=rank, size=cp))
        mine = chunk_positions(seq, cp, rank)
        assert torch.equal(own_tokens(ids), ids[:, mine])
        assert torch.equal(own_tokens(ids.t(), 0), ids.t()[mine])
        assert torch.equal(token_positions(seq // cp, torch.device("cpu")), mine)
        assert message_shape((3, seq, 8)) == (3, seq // cp, 8)
    finally:
        set_context(None)
    assert torch.equal(own_tokens(ids), ids)  # no group: the whole sequence
    assert message_shape((3, seq, 8)) == (3, seq, 8)
