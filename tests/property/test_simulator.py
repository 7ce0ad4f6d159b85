"""The event simulator against closed forms, and the fast evaluator against it."""

from __future__ import annotations

from itertools import pairwise

from helpers import random_problems, uniform_problem
from hypothesis import given
from hypothesis import strategies as st

from ppsim.sim.evaluate import evaluate
from ppsim.sim.simulate import simulate
from ppsim.sim.timing import compile_schedule, op_table

# Integer-valued costs keep every sum exact in floating point.
costs = st.integers(1, 9).map(float)


@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 6), st.integers(1, 12),
       st.integers(1, 3), costs, costs)
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(name, pp, m, layers, f, b):
    sim = simulate(uniform_problem(pp, 1, m, name, layers_per_stage=layers, f=f, b=b))
    assert sim.summary.iteration_time_ms == (m + pp - 1) * layers * (f + b)


@given(st.integers(2, 5), st.integers(2, 3), st.integers(1, 3), st.integers(1, 2), costs, costs)
def test_interleaved_takes_mv_plus_p_minus_1_slots(pp, vpp, groups, layers, f, b):
    m = pp * groups
    sim = simulate(uniform_problem(pp, vpp, m, "interleaved-1f1b", layers_per_stage=layers,
                                   f=f, b=b))
    assert sim.summary.iteration_time_ms == (m * vpp + pp - 1) * layers * (f + b)


@given(st.integers(1, 6), st.integers(1, 12))
def test_peak_inflight_1f1b_and_gpipe(pp, m):
    one = simulate(uniform_problem(pp, 1, m, "1f1b")).summary
    gp = simulate(uniform_problem(pp, 1, m, "gpipe")).summary
    for r in range(pp):
        assert one.ranks[r].peak_inflight == min(pp - r, m)
        assert gp.ranks[r].peak_inflight == m


@given(st.integers(2, 5), st.integers(2, 3), st.integers(1, 3))
def test_peak_inflight_interleaved(pp, vpp, groups):
    m = pp * groups
    s = simulate(uniform_problem(pp, vpp, m, "interleaved-1f1b")).summary
    for r in range(pp):
        assert s.ranks[r].peak_inflight == min(2 * (pp - r - 1) + (vpp - 1) * pp + 1, m * vpp)


@given(random_problems())
def test_fast_evaluator_equals_simulator_exactly(problem):
    sim = simulate(problem)
    table = op_table(compile_schedule(problem.schedule), problem.stage_costs,
                     problem.hardware.transfer_ms)
    layers = [problem.split.rank_layers(r) for r in range(problem.split.pp)]
    assert evaluate(table, layers, problem.hardware.memory_bytes) == sim.summary


@given(random_problems())
def test_memory_returns_to_baseline_and_respects_order(problem):
    sim = simulate(problem)
    for r, events in enumerate(sim.timeline.memory):
        assert events, f"rank {r} recorded no memory events"
        assert events[-1][1] == 0 and events[-1][2] == 0  # activations and in-flight back to 0
        assert all(e[1] >= 0 for e in events)
        times = [e[0] for e in events]
        assert times == sorted(times)
        # Peak memory is static plus the largest activation level seen.
        assert sim.summary.ranks[r].peak_memory_bytes == (
            sim.timeline.static[r] + max(e[1] for e in events))


@given(random_problems())
def test_ops_respect_dependencies_and_never_overlap(problem):
    sim = simulate(problem)
    end = {}
    for ops in sim.timeline.ops:
        for a, b in pairwise(ops):
            assert b.start >= a.end
        for op in ops:
            end[op.action] = op.end
    n = problem.split.num_stages
    for ops in sim.timeline.ops:
        for op in ops:
            a = op.action
            if a.kind == "F" and a.stage > 0:
                assert op.start >= end[type(a)("F", a.stage - 1, a.microbatch)]
            if a.kind == "B" and a.stage < n - 1:
                assert op.start >= end[type(a)("B", a.stage + 1, a.microbatch)]


def test_transfers_delay_the_receiver_by_latency_plus_bytes_over_bandwidth():
    free = simulate(uniform_problem(2, 1, 1, "1f1b", f=1.0, b=2.0, out=2_000_000))
    slow = simulate(uniform_problem(2, 1, 1, "1f1b", f=1.0, b=2.0, out=2_000_000,
                                    hw={"p2p_latency_ms": 0.5, "p2p_bandwidth_gbps": 1.0}))
    # One activation forward and one gradient back, each 0.5 ms + 2 MB / (1 GB/s) = 2.5 ms.
    assert slow.summary.iteration_time_ms - free.summary.iteration_time_ms == 2 * 2.5
    assert len(slow.timeline.transfers) == 2


def test_head_and_embedding_sit_on_first_and_last_stage():
    p = uniform_problem(2, 1, 2, "1f1b", counts=[2, 2], static=10,
                        head={"static_bytes": 5000}, emb={"static_bytes": 300})
    s = simulate(p).summary
    assert s.ranks[0].static_bytes == 2 * 10 + 300
    assert s.ranks[1].static_bytes == 2 * 10 + 5000
