"""The planner's peak memory takes its maximum over a rank's maximal in-flight records
(ppsim.plan.search.maximal): with bytes >= 0 the same maximum as over all of them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ppsim.plan.search import maximal

records = st.integers(1, 6).flatmap(lambda d: st.tuples(
    st.lists(st.tuples(*[st.integers(0, 5)] * d), min_size=1, max_size=40),
    st.lists(st.integers(0, 10**9), min_size=d, max_size=d)))


@given(records)
def test_a_weighted_peak_over_the_maximal_records_is_the_peak_over_all(case) -> None:
    recs, weights = case
    kept = maximal(recs)

    def peak(rs: list[tuple[int, ...]]) -> int:
        return max(sum(c * w for c, w in zip(r, weights, strict=True)) for r in rs)

    assert peak(kept) == peak(recs)
    assert set(kept) <= set(recs)


@given(records)
def test_no_kept_record_is_covered_by_another(case) -> None:
    kept = maximal(case[0])
    assert len(set(kept)) == len(kept)
    for a in kept:
        for b in kept:
            assert a == b or not all(x >= y for x, y in zip(a, b, strict=True))
