"""Which shapes the job search plans the splits of (ppsim.job.search.shapes_to_plan): the k
most promising tie groups that fit at their default split always (by what planning might
reach; shapes tied there, the same work a rank, count once), the fastest at its default
split, and more promising ones that do not fit (an uneven split may fit), never crowding
those out. Ranked by their default time, the k most promising are the k fastest."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from ppsim.job.choice import default_ms, tie_key
from ppsim.job.search import shapes_to_plan
from ppsim.plan.bounds import least_largest_run

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


@given(shapes, st.integers(1, 6), st.data())
def test_by_reach_the_most_promising_and_the_fastest_are_planned(results, k, data) -> None:
    """Ranked by an estimate of what planning reaches (at most the default time): the k
    most promising fitting groups, and the fastest at its default split whatever its
    estimate, so the answer is never slower than the default ranking's first."""
    cut = {id(r): data.draw(st.integers(0, 40)) for r in results}
    reach = lambda r: default_ms(r) - cut[id(r)]  # noqa: E731
    chosen = shapes_to_plan(results, k, reach=reach)
    fitting = [r for r in results if r.summary.fits]
    if not fitting:
        assert all(not r.summary.fits for r in chosen)
        return
    fastest = min(default_ms(r) for r in fitting)
    assert any(r.summary.fits and default_ms(r) == fastest for r in chosen)
    by_reach = sorted(fitting, key=reach)
    groups = list(dict.fromkeys(tie_key(r) for r in by_reach))[:k]
    picked = {tie_key(r) for r in chosen if r.summary.fits}
    assert set(groups) <= picked <= set(groups) | {tie_key(r) for r in fitting
                                                    if default_ms(r) == fastest}
    scores = [reach(r) for r in chosen]
    assert scores == sorted(scores)  # the most promising planned first
    assert len({tie_key(r) for r in chosen}) <= 2 * k


def _least_fullest(pieces: list[float], parts: int) -> float:
    """Every contiguous cut of `pieces` into `parts` runs, tried: the least fullest run."""
    if parts == 1 or not pieces:
        return sum(pieces)
    return min(max(sum(pieces[:i]), _least_fullest(pieces[i:], parts - 1))
               for i in range(len(pieces) + 1))


@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=9), st.integers(1, 5))
def test_the_least_largest_run_is_the_best_contiguous_cut(pieces, parts) -> None:
    got = least_largest_run(pieces, parts)
    want = _least_fullest(pieces, parts)
    assert want <= got <= want * (1 + 1e-9) + 1e-12
