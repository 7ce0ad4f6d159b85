"""Invariants of the simulator that hold for any problem: it is deterministic, its
iteration time only grows with any op's cost and scales with all of them, and a split's
static bytes do not depend on the schedule that runs it.

Why they hold: every rank runs a fixed list, each op starting at the later of its rank
being free and its input arriving, so an op's end is a max of sums of durations and
delays (a max-plus expression). Such an expression never falls when one term grows, and
doubling every term doubles it (exactly, in binary floating point). Static bytes are
what each rank holds whatever runs: its layers' parameters and state, plus the embedding
on the rank of stage 0 and the head on the rank of the last stage.
"""

from __future__ import annotations

from dataclasses import replace

from helpers import random_problems, uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.model import LayerCost
from ppsim.pipeline.problem import Problem
from ppsim.sim.simulate import simulate


def _time(p: Problem) -> float:
    return simulate(p, record=False).summary.iteration_time_ms


def _layers(p: Problem, edit) -> Problem:
    return replace(p, costs=replace(p.costs, layers=tuple(edit(i, c) for i, c in
                                                          enumerate(p.costs.layers))))


@settings(max_examples=40, deadline=None)
@given(random_problems())
def test_the_simulation_is_deterministic(problem):
    # A cache or counter left over from the first run would change the second.
    first, again = simulate(problem), simulate(problem)
    assert first.summary == again.summary and first.timeline == again.timeline
    assert simulate(problem, record=False).summary == first.summary


@settings(max_examples=40, deadline=None)
@given(random_problems(), st.integers(0, 10**6), st.sampled_from(["forward_ms", "backward_ms"]),
       st.floats(0.01, 20.0))
def test_a_slower_op_never_shortens_the_iteration(problem, pick, field, extra):
    at = pick % len(problem.costs.layers)

    def slower(i: int, c: LayerCost) -> LayerCost:
        return replace(c, **{field: getattr(c, field) + extra}) if i == at else c

    assert _time(_layers(problem, slower)) >= _time(problem)


@settings(max_examples=30, deadline=None)
@given(random_problems(), st.floats(0.001, 5.0))
def test_a_slower_link_never_shortens_the_iteration(problem, extra):
    hw = problem.hardware
    slow = replace(problem, hardware=replace(hw, p2p_latency_ms=hw.p2p_latency_ms + extra))
    assert _time(slow) >= _time(problem)


@settings(max_examples=30, deadline=None)
@given(random_problems())
def test_twice_every_cost_takes_twice_the_time(problem):
    def double(c: LayerCost) -> LayerCost:
        return replace(c, forward_ms=2 * c.forward_ms, backward_ms=2 * c.backward_ms,
                       weight_grad_ms=2 * c.weight_grad_ms,
                       split_backward_ms=2 * c.split_backward_ms)

    costs = problem.costs
    hw = problem.hardware
    slow = replace(problem, costs=replace(
        costs, layers=tuple(double(c) for c in costs.layers),
        head=None if costs.head is None else double(costs.head),
        embedding=None if costs.embedding is None else double(costs.embedding)),
        hardware=replace(hw, p2p_latency_ms=2 * hw.p2p_latency_ms,
                         p2p_bandwidth_gbps=hw.p2p_bandwidth_gbps / 2))
    assert _time(slow) == 2 * _time(problem)


@st.composite
def one_split(draw):
    """A split of random counts and the schedules of its placement that take it."""
    pp = draw(st.integers(1, 4))
    v = draw(st.booleans())
    vpp = 2 if v else 1
    counts = draw(st.lists(st.integers(0, 4), min_size=pp * vpp, max_size=pp * vpp))
    m = draw(st.integers(2 * pp, 2 * pp + 3))  # enough for DualPipeV too
    names = ["zbv", "dualpipev"] if v else ["gpipe", "1f1b", "zb-h1", "interleaved-zb"]
    return pp, vpp, m, counts, names, draw(st.integers(0, 10**9)), \
        draw(st.integers(0, 10**9)), draw(st.integers(0, 10**9))


@settings(max_examples=40, deadline=None)
@given(one_split())
def test_static_bytes_are_the_splits_whatever_the_schedule(shape):
    pp, vpp, m, counts, names, per_layer, head, emb = shape
    if sum(counts) == 0:
        counts[0] = 1
    stages = pp * vpp
    # V placement: the second chunk walks back, so stage s >= pp sits on rank 2pp-1-s.
    rank_of = [s if s < pp else 2 * pp - 1 - s for s in range(stages)]
    want = [per_layer * sum(c for s, c in enumerate(counts) if rank_of[s] == r)
            for r in range(pp)]
    want[rank_of[0]] += emb
    want[rank_of[stages - 1]] += head
    for name in names:
        s = simulate(uniform_problem(pp, vpp, m, name, counts=counts, static=per_layer,
                                     head={"static_bytes": head},
                                     emb={"static_bytes": emb})).summary
        assert [r.static_bytes for r in s.ranks] == want, name
        for r in s.ranks:
            assert r.peak_activation_bytes >= 0
            assert r.peak_memory_bytes == r.static_bytes + r.peak_activation_bytes
