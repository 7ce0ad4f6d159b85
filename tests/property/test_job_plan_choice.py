"""Which shapes the job search plans the splits of (ppsim.job.search.shapes_to_plan): the k
fastest tie groups that fit at their default split always (shapes tied there, the same
work a rank, count once), and faster ones that do not (an uneven split may fit), never
crowding those out; then long shots (ppsim.job.choice.long_shots)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from ppsim.job.choice import long_shots, tie_key
from ppsim.job.search import shapes_to_plan
from ppsim.plan.bounds import least_largest_fitting_run

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


@given(shapes, st.integers(1, 6), st.integers(1, 50), st.data())
def test_long_shots_are_the_most_promising_of_the_rest(results, k, best, data) -> None:
    """Beyond the planned shapes: those that fit and might beat the best planned time
    (their estimate below it), most promising first, k tie groups at the most."""
    cut = {id(r): data.draw(st.integers(0, 40)) for r in results}
    reach = lambda r: r.summary.iteration_time_ms - cut[id(r)]  # noqa: E731
    planned = shapes_to_plan(results, k)
    shots = long_shots(results, planned, float(best), k, reach=reach)
    assert not {id(r) for r in shots} & {id(r) for r in planned}
    assert all(r.summary.fits and reach(r) < best for r in shots)
    scores = [reach(r) for r in shots]
    assert scores == sorted(scores)
    groups = list(dict.fromkeys(tie_key(r) for r in shots))
    assert len(groups) <= k
    # none left out that is more promising than one taken, unless k groups are full
    left = [r for r in results if r.summary.fits and reach(r) < best
            and all(r is not x for x in planned + shots)]
    if len(groups) < k:
        assert not left
    else:
        assert all(reach(r) >= max(scores) or tie_key(r) in groups for r in left)


def _least_fullest(pieces: list[float], parts: int) -> float:
    """Every contiguous cut of `pieces` into `parts` runs, tried: the least fullest run."""
    if parts == 1 or not pieces:
        return sum(pieces)
    return min(max(sum(pieces[:i]), _least_fullest(pieces[i:], parts - 1))
               for i in range(len(pieces) + 1))


@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=9), st.integers(1, 5))
def test_the_least_largest_run_is_the_best_contiguous_cut(pieces, parts) -> None:
    """With nothing to keep in memory, every cut fits."""
    got = least_largest_fitting_run(pieces, [(0, 0)] * len(pieces), [0] * parts, 1.0)
    want = _least_fullest(pieces, parts)
    assert want <= got <= want * (1 + 1e-9) + 1e-12


@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([0.0, 1e-11, 2e-11]),
                          st.sampled_from([1, 2])), min_size=2, max_size=12))
def test_of_tied_shapes_the_fewest_context_parallel_ranks_come_first(rows) -> None:
    """The same work a rank (cp n at n sequences a microbatch) ties to a part in 10^9; the
    table leads with the shape without the ring, whatever float noise says: it led with
    cp 4 at mbs 4 over cp 1 at mbs 1, 1e-11 ms apart (Llama 3 70B on 128 GPUs)."""
    from ppsim.job.search import _fastest_first

    results = [SimpleNamespace(
        summary=SimpleNamespace(iteration_time_ms=26747.593202920 + t * 26747.0, fits=True,
                                peak_memory_bytes=60 << 30),
        shape=SimpleNamespace(cp=cp, tp=8, pp=2, ep=1, vpp=vpp, mbs=cp))
        for cp, t, vpp in rows]
    ordered = [(r.shape.cp, r.shape.vpp) for r in _fastest_first(results)]
    assert ordered == sorted(ordered)


def _least_fitting_by_every_cut(work, kept, held, limit):
    """The least largest run over every contiguous cut of the pieces over the ranks in
    order (some empty) whose every rank keeps within `limit`; None when none does."""
    import itertools

    n, best = len(work), None
    for cuts in itertools.combinations_with_replacement(range(n + 1), len(held) - 1):
        edges = (0, *cuts, n)
        runs = [range(a, b) for a, b in itertools.pairwise(edges)]
        if all(sum(kept[i][0] + h * kept[i][1] for i in run) <= limit
               for run, h in zip(runs, held, strict=True)):
            largest = max(sum(work[i] for i in run) for run in runs)
            best = largest if best is None else min(best, largest)
    return best


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 50), st.integers(0, 20)),
                min_size=1, max_size=7),
       st.lists(st.integers(0, 4), min_size=1, max_size=4), st.integers(0, 200))
def test_the_fitting_reach_is_the_least_largest_run_of_the_cuts_that_fit(pieces, held,
                                                                         limit) -> None:
    """What ppsim.job.choice's estimate takes off, cut greedily and bisected, against
    every cut."""
    work = [float(w) for w, _, _ in pieces]
    kept = [(s, a) for _, s, a in pieces]
    got = least_largest_fitting_run(work, kept, held, limit)
    want = _least_fitting_by_every_cut(work, kept, held, limit)
    if want is None:
        assert got is None
    else:
        assert got is not None and abs(got - want) <= want * 1e-9
