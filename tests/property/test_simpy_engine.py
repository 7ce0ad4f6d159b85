"""The simpy engine equals the heap engine to the last digit, shared placements included."""

from __future__ import annotations

from dataclasses import replace

from helpers import random_problems, small_shapes, uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.pipeline.placement import PlacementConfig, topology
from ppsim.pipeline.problem import Problem
from ppsim.sim import simpy_engine
from ppsim.sim import simulate as engine


@st.composite
def tied_problems(draw) -> Problem:
    """Quarter-millisecond costs: many ops end and messages arrive at one instant, where
    the order of events decides who shares a device with whom."""
    name, pp, vpp, m = draw(small_shapes(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv",
                                          "dualpipev"]))
    t = st.integers(1, 16).map(lambda x: x / 4)
    counts = draw(st.lists(st.integers(0, 3), min_size=pp * vpp, max_size=pp * vpp))
    counts[0] += 1
    b = draw(t)
    hw = {"p2p_latency_ms": draw(st.sampled_from([0.0, 0.0, 0.25, 0.3])),
          "p2p_bandwidth_gbps": draw(st.sampled_from([0.0, 1.0]))}
    return uniform_problem(pp, vpp, m, name, counts=counts, f=draw(t), b=b, w=b / 2,
                           act=draw(st.sampled_from([0, 100])), wg=draw(st.sampled_from([0, 60])),
                           out=draw(st.sampled_from([0, 250_000, 10**6])), hw=hw,
                           head={"forward_ms": draw(t), "backward_ms": draw(t)})


@st.composite
def placed(draw, problems: st.SearchStrategy[Problem]) -> Problem:
    """A problem with a random placement: shared devices, nodes, shared links, CPU costs."""
    p = draw(problems)
    pp = p.schedule.pp
    rpn = draw(st.sampled_from([0, 1, 2]))
    # Devices never span nodes: node k's ranks draw from node k's own device indices
    # (few of them, so that ranks often share one).
    devices = [(r // rpn if rpn else 0) * pp + draw(st.integers(0, max(1, pp // 2)))
               for r in range(pp)]
    cfg = PlacementConfig(devices=devices, ranks_per_node=rpn,
                          shared_links=draw(st.booleans()),
                          inter_node_latency_ms=draw(st.sampled_from([None, 0.0, 0.5])),
                          context_switch_ms=draw(st.sampled_from([0.25, 0.0])),
                          message_cpu_ms=draw(st.sampled_from([0.0, 0.125])),
                          local_message_cpu_ms=draw(st.sampled_from([0.0, 0.25])))
    hw = p.hardware
    return replace(p, topology=topology(cfg, pp, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps))


@st.composite
def pooled(draw, problems: st.SearchStrategy[Problem]) -> Problem:
    """A problem whose unpinned ranks and their data-parallel twins share a few cores."""
    p = draw(problems)
    pp = p.schedule.pp
    cfg = PlacementConfig(message_cpu_ms=draw(st.sampled_from([0.0, 0.125])))
    hw = p.hardware
    return replace(p, topology=topology(cfg, pp, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps,
                                        draw(st.integers(1, pp)), draw(st.integers(1, 3))))


def assert_same(problem: Problem) -> None:
    ours, theirs = engine.simulate(problem), simpy_engine.simulate(problem)
    # Exact equality of every float: iteration time, each rank's busy time and peaks.
    assert theirs.summary == ours.summary
    a, b = ours.timeline, theirs.timeline
    assert a is not None and b is not None
    assert b.ops == a.ops  # every op's start and end, per rank, in order
    assert b.memory == a.memory
    assert b.step == a.step and b.static == a.static
    # The heap engine lists a transfer when sent (private links) or when it arrives
    # (shared placements); the simpy engine always when it arrives: the same set.
    assert sorted(map(repr, b.transfers)) == sorted(map(repr, a.transfers))
    unrecorded = simpy_engine.simulate(problem, record=False)
    assert unrecorded.timeline is None and unrecorded.summary == ours.summary


@settings(max_examples=80, deadline=None)
@given(random_problems())
def test_simpy_engine_equals_the_event_engine(problem):
    assert_same(problem)


@settings(max_examples=80, deadline=None)
@given(tied_problems())
def test_simpy_engine_equals_the_event_engine_with_ties(problem):
    assert_same(problem)


@settings(max_examples=120, deadline=None)
@given(placed(tied_problems()))
def test_simpy_engine_equals_the_event_engine_on_shared_placements(problem):
    assert_same(problem)


@settings(max_examples=60, deadline=None)
@given(placed(random_problems()))
def test_simpy_engine_equals_the_event_engine_on_random_placements(problem):
    assert_same(problem)


@settings(max_examples=80, deadline=None)
@given(pooled(tied_problems()))
def test_simpy_engine_equals_the_event_engine_on_pooled_cores(problem):
    assert_same(problem)


def test_a_message_that_arrives_at_once_starts_its_receiver_first():
    """Rank 0's F0 ends at 1 ms and its message reaches rank 1 at once: on the shared
    device rank 1's F0 starts first, alone, and rank 0's F1 pays the context switch."""
    p = uniform_problem(2, 1, 3, "gpipe", counts=[1, 2], f=1.0, b=1.0,
                        hw={"p2p_latency_ms": 0.0, "p2p_bandwidth_gbps": 0.0})
    p = replace(p, topology=topology(PlacementConfig(devices=[0, 0], context_switch_ms=0.25),
                                     2, 0.0, 0.0))
    sim = simpy_engine.simulate(p)
    assert sim.timeline is not None
    first = [(op.start, op.end) for op in sim.timeline.ops[0][:3]]
    assert first == [(0.0, 1.0), (1.0, 3.5), (3.5, 6.0)]
    assert sim.summary.iteration_time_ms == 19.25
    assert_same(p)


def test_a_shared_device_and_link_change_the_numbers():
    """The comparison above is not vacuous: sharing slows a run in both engines alike."""
    p = uniform_problem(2, 1, 4, "gpipe", counts=[1, 1], f=0.5, b=1.0, out=10**6,
                        hw={"p2p_latency_ms": 0.0, "p2p_bandwidth_gbps": 1.0})
    alone = simpy_engine.simulate(p).summary.iteration_time_ms
    shared = replace(p, topology=topology(PlacementConfig(devices=[0, 0], context_switch_ms=0.25,
                                                          shared_links=True), 2, 0.0, 1.0))
    together = simpy_engine.simulate(shared).summary.iteration_time_ms
    assert together > alone
    assert together == engine.simulate(shared).summary.iteration_time_ms
