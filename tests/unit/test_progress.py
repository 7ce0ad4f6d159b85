"""Issue 27, defect 7: who a timed-out rank blames, from the ranks' progress records."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.executor.progress import Progress, Record, blame, parse, stalled

records = st.lists(st.builds(Record, rank=st.integers(0, 7), done=st.integers(0, 100),
                             last_at=st.floats(0, 1e6), waiting=st.booleans()),
                   max_size=8, unique_by=lambda r: r.rank)


@settings(max_examples=200, deadline=None)
@given(recs=records, me=st.integers(0, 7))
def test_the_blamed_rank_is_another_busy_rank_that_finished_earliest(recs, me) -> None:
    got = stalled(recs, me)
    if got is None:
        return
    assert got.rank != me
    pool = [r for r in recs if not r.waiting] or recs
    assert got in pool and got.last_at == min(r.last_at for r in pool)


def test_a_rank_blocked_in_a_receive_is_not_blamed_while_another_computes() -> None:
    waiting = Record(rank=0, done=10, last_at=100.0, waiting=True)
    computing = Record(rank=1, done=12, last_at=105.0, current="F2 (stage 1)")
    assert stalled([waiting, computing], me=0) == computing
    assert stalled([waiting, computing], me=1) is None  # the culprit blames no one else


def test_a_record_crosses_the_store_and_names_the_op() -> None:
    p = Progress()
    p.record.rank = 3
    p.start("F1 (stage 3) of iteration 0")
    p.finish("F1 (stage 3) of iteration 0")
    p.start("B1 (stage 3) of iteration 0")
    rec = parse(p.snapshot().encode())
    assert rec is not None and rec.rank == 3 and rec.done == 1
    line = blame(rec, 0, "rank 0 failed in B1: timed out", now=rec.last_at + 12.0)
    assert line.startswith("rank 3 failed: it made no progress for 12.0 s, still in B1")
    assert parse(b"not json") is None
