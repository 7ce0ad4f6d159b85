"""Which shapes the job search plans the splits of (ppsim.job.search.shapes_to_plan): the k
fastest tie groups that fit at their default split always (shapes tied there, the same
work a rank, count once), and faster ones that do not (an uneven split may fit), never
crowding those out."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from ppsim.job.choice import tie_key
from ppsim.job.search import shapes_to_plan

shapes = st.lists(st.tuples(st.integers(1, 50), st.booleans()), max_size=30).map(
    lambda rows: [SimpleNamespace(summary=SimpleNamespace(iteration_time_ms=float(t), fits=f))
                  for t, f in rows])


@given(shapes, st.integers(1, 6))
def test_the_fastest_fitting_shapes_are_always_planned(results, k) -> None:
    chosen = shapes_to_plan(results, k)
    assert len({id(r) for r in chosen}) == len(chosen)  # each once, all from results
    assert {id(r) for r in chosen} <= {id(r) for r in results}
    rest = [r for r in results if all(r is not c for c in chosen)]
    assert len({tie_key(r) for r in chosen}) <= 2 * k
    fitting = sorted((r for r in results if r.summary.fits),
                     key=lambda r: r.summary.iteration_time_ms)
    fitting_chosen = [r for r in chosen if r.summary.fits]
    groups = list(dict.fromkeys(tie_key(r) for r in fitting))
    assert list(dict.fromkeys(tie_key(r) for r in fitting_chosen)) == groups[:k]
    # a tie is planned whole: every fitting shape of a chosen group is chosen
    assert all(r in fitting_chosen for r in fitting if tie_key(r) in groups[:k])
    if fitting_chosen:  # the fastest of them (ties by any order)
        slowest = max(r.summary.iteration_time_ms for r in fitting_chosen)
        assert all(r.summary.iteration_time_ms >= slowest for r in rest if r.summary.fits)
    if len(groups) >= k:  # a shape that does not fit is planned only if it could lead
        kth = max(r.summary.iteration_time_ms for r in fitting_chosen)
        assert all(r.summary.iteration_time_ms < kth for r in chosen if not r.summary.fits)
    times = [r.summary.iteration_time_ms for r in chosen]
    assert times == sorted(times)  # planned fastest first


@given(shapes, st.integers(1, 6))
def test_without_ties_each_shape_takes_its_own_slot(results, k) -> None:
    """A memory policy search plans each shape on its own: k fitting shapes, ties or not."""
    chosen = shapes_to_plan(results, k, ties=False)
    fitting = [r for r in results if r.summary.fits]
    assert len([r for r in chosen if r.summary.fits]) == min(k, len(fitting))
    assert len(chosen) <= 2 * k
