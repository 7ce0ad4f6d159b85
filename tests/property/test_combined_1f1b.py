"""Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm) in every engine.

The order is Megatron's 1F1B with one more warm-up forward (schedules.py's
get_pp_rank_microbatches); each steady-phase F runs with the B after it: the pair starts
once both inputs are in, and both messages leave when the B ends (combined_1f1b.py runs
one combined step, then its sends).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import combined, every_split, uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st
from test_simpy_engine import assert_same, placed

from ppsim.plan.bounds import PathBounds
from ppsim.plan.planner import plan
from ppsim.plan.prefix import prefix_time
from ppsim.plan.search import SplitSearch
from ppsim.schedules.actions import B, F
from ppsim.schedules.generators import build_schedule
from ppsim.schedules.validate import validate
from ppsim.sim.evaluate import evaluate
from ppsim.sim.simulate import simulate
from ppsim.sim.timing import compile_schedule, op_table


@st.composite
def combined_shapes(draw) -> tuple[str, int, int, int]:
    """(schedule, pp, vpp, microbatches) Megatron runs combined: 1F1B without pipelining,
    interleaved 1F1B with it."""
    pp = draw(st.integers(1, 4))
    if pp == 1:
        return "1f1b", 1, 1, draw(st.integers(1, 8))
    return "interleaved-1f1b", pp, draw(st.integers(2, 3)), pp * draw(st.integers(1, 3))


@st.composite
def combined_problems(draw, max_layers: int = 4):
    name, pp, vpp, m = draw(combined_shapes())
    times = st.integers(1, 16).map(lambda x: x / 4)
    counts = draw(st.lists(st.integers(0, max_layers), min_size=pp * vpp,
                           max_size=pp * vpp))
    counts[0] += 1
    b = draw(times)
    base = uniform_problem(pp, vpp, m, name, counts=counts, f=draw(times), b=b,
                           act=draw(st.integers(0, 1000)), out=draw(st.sampled_from([0, 10**6])),
                           hw={"p2p_latency_ms": draw(st.sampled_from([0.0, 0.25, 0.5])),
                               "p2p_bandwidth_gbps": 2.0},
                           head={"forward_ms": draw(times), "backward_ms": draw(times)},
                           memory=draw(st.sampled_from([1e12, 9000.0])))
    return combined(base, draw(st.lists(times, min_size=1, max_size=3)))


@settings(max_examples=60, deadline=None)
@given(combined_shapes())
def test_the_order_is_megatrons_1f1b_with_one_more_warm_up_forward(shape):
    name, pp, vpp, m = shape
    plain, ours = build_schedule(name, pp, vpp, m), build_schedule(name, pp, vpp, m,
                                                                   combined=True)
    validate(ours)
    total = m * vpp
    for r in range(pp):
        mine, theirs = list(ours.actions[r]), list(plain.actions[r])
        # The forwards and the backwards each come in the same order as 1F1B's.
        assert [a for a in mine if a.kind == F] == [a for a in theirs if a.kind == F]
        assert [a for a in mine if a.kind == B] == [a for a in theirs if a.kind == B]
        lead = next(i for i, a in enumerate(theirs) if a.kind == B)  # warm-up, first step's F
        ahead = next(i for i, a in enumerate(mine) if a.kind == B)
        assert ahead == min(lead + 1, total)
        pairs = ours.pairs[r]
        # Every steady-phase step is one pair: an F with the B right after it (none when
        # the warm-up runs every forward).
        assert len(pairs) == (total - ahead + 1 if ahead < total else 0)
        assert all(mine[i].kind == F and mine[i + 1].kind == B for i in pairs)
    assert plain.pairs == ()


@settings(max_examples=80, deadline=None)
@given(combined_problems())
def test_every_engine_times_the_pairs_alike(problem):
    assert_same(problem)  # the simpy engine equals the heap engine to the last digit
    sim = simulate(problem)
    table = op_table(compile_schedule(problem.schedule), problem.stage_costs,
                     problem.hardware.transfer_ms)
    layers = [problem.split.rank_layers(r) for r in range(problem.schedule.pp)]
    assert evaluate(table, layers, problem.hardware.memory_bytes) == sim.summary
    assert SplitSearch(problem).evaluate(problem.split.counts) == sim.summary


@settings(max_examples=40, deadline=None)
@given(placed(combined_problems()))
def test_pairs_on_shared_devices_and_links_agree_too(problem):
    assert_same(problem)


@settings(max_examples=80, deadline=None)
@given(combined_problems())
def test_a_pair_starts_with_both_inputs_in_and_sends_both_when_its_b_ends(problem):
    tl = simulate(problem).timeline
    assert tl is not None
    sent_by = {t.action: t for t in tl.transfers}
    arrived = {(t.action.kind, t.action.stage, t.action.microbatch): t.end
               for t in tl.transfers}
    n = problem.schedule.num_stages
    for r, ops in enumerate(tl.ops):
        for i in problem.schedule.pairs[r]:
            f, b = ops[i], ops[i + 1]
            assert f.action.kind == F and b.action.kind == B and f.end == b.start
            # B's gradient comes from the next stage's B of its microbatch.
            if b.action.stage < n - 1:
                src = (B, b.action.stage + 1, b.action.microbatch)
                assert f.start >= arrived.get(src, 0.0)
            if f.action in sent_by:
                assert sent_by[f.action].start == b.end


@settings(max_examples=60, deadline=None)
@given(combined_problems(), st.floats(0.0, 1.0))
def test_hiding_more_never_slows_the_iteration(problem, share):
    less = replace(problem, costs=replace(problem.costs, layers=tuple(
        replace(c, pair_saving_ms=c.pair_saving_ms * share) for c in problem.costs.layers)))
    assert simulate(problem).summary.iteration_time_ms <= \
        simulate(less).summary.iteration_time_ms + 1e-9


@st.composite
def plannable(draw):
    name, pp, vpp, m = draw(combined_shapes().filter(lambda s: s[1] * s[2] <= 4))
    layers = draw(st.integers(pp * vpp, 7))
    times = st.integers(1, 16).map(lambda x: x / 4)
    b = draw(times)
    base = uniform_problem(pp, vpp, m, name, counts=[layers] + [0] * (pp * vpp - 1),
                           f=draw(times), b=b, act=100, static=300,
                           out=draw(st.sampled_from([0, 10**6])),
                           hw={"p2p_latency_ms": draw(st.sampled_from([0.0, 0.25])),
                               "p2p_bandwidth_gbps": 2.0},
                           head={"forward_ms": draw(times), "backward_ms": draw(times),
                                 "static_bytes": 900},
                           memory=draw(st.sampled_from([1e12, 6000.0, 15000.0])))
    return combined(base, draw(st.lists(times, min_size=1, max_size=3)))


@settings(max_examples=40, deadline=None)
@given(plannable())
def test_the_planner_stays_exact_under_pairs(problem):
    s = problem.split
    results = every_split(problem)
    for counts, sim in results:
        # The bounds stay bounds: every F and B as short as in a pair.
        paths, spans, at = PathBounds(SplitSearch(problem)), {}, 0
        for i, n in enumerate(counts):
            spans[i] = (at, n)
            at += n
        assert all(paths.rank_term(r, spans) <= sim.iteration_time_ms for r in range(s.pp))
        assert all(prefix_time(paths, list(counts[:k])) <= sim.iteration_time_ms
                   for k in range(1, s.num_stages))
    fitting = [(x.iteration_time_ms, c) for c, x in results if x.fits]
    res = plan(problem, top_k=1)
    if not fitting:
        assert res.best is None
        return
    assert res.best is not None and res.proven_optimal
    assert res.best.summary.iteration_time_ms == pytest.approx(min(fitting)[0], rel=1e-9)
