"""The host copy streams (activation offload) in every engine: same numbers, exact peaks,
late copies stall the backward, and no offload leaves every engine as it was."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from helpers import random_problems, uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st
from test_simpy_engine import assert_same, placed, tied_problems

from ppsim.config.schema import config_from_dict
from ppsim.costs.model import ModelCosts, StageCost, stage_cost
from ppsim.pipeline.problem import Problem, build_problem
from ppsim.plan.planner import plan
from ppsim.policy.costs import Fixed
from ppsim.policy.model import StagePolicy
from ppsim.policy.report import copy_events
from ppsim.policy.search import RESIMULATED, SpaceBest, resimulated
from ppsim.policy.setup import policy_costs
from ppsim.sim import simpy_engine
from ppsim.sim.copies import estimated, wake_delay
from ppsim.sim.evaluate import evaluate
from ppsim.sim.simulate import simulate
from ppsim.sim.timing import compile_schedule, op_table


@dataclass(frozen=True, kw_only=True)
class Offload:
    """A memory policy's stage costs for tests: every stage offloads `fraction` of its
    activations, each copy taking `ms_per_mb` per megabyte."""

    costs: ModelCosts
    """The plain costs."""
    fraction: float
    """Share of a stage's activation bytes offloaded."""
    ms_per_mb: float
    """Copy time per 1e6 bytes."""

    def stage_cost(self, offset: int, count: int, index: int, first: bool, last: bool,
                   receives: bool, fits: object = None) -> StageCost:
        c = stage_cost(self.costs, offset, count, first, last, receives)
        off = int(self.fraction * c.activation_bytes)
        return replace(c, offload_bytes=off, copy_ms=off / 1e6 * self.ms_per_mb)


def offloaded(p: Problem, fraction: float, ms_per_mb: float) -> Problem:
    return replace(p, memory=Offload(costs=p.costs, fraction=fraction, ms_per_mb=ms_per_mb))


fractions = st.sampled_from([0.25, 0.5, 1.0])
speeds = st.sampled_from([0.0, 0.25, 1.0, 4.0])


@settings(max_examples=60, deadline=None)
@given(random_problems(), fractions, speeds)
def test_simpy_engine_equals_the_event_engine_with_copies(problem, frac, speed):
    assert_same(offloaded(problem, frac, speed))


@settings(max_examples=60, deadline=None)
@given(placed(tied_problems()), fractions, st.sampled_from([0.0, 0.25, 2.5]))
def test_engines_agree_with_copies_on_shared_placements(problem, frac, speed):
    p = replace(problem, costs=replace(problem.costs, layers=tuple(
        replace(lc, activation_bytes=400_000) for lc in problem.costs.layers)))
    assert_same(offloaded(p, frac, speed))


@settings(max_examples=60, deadline=None)
@given(random_problems())
def test_without_offload_the_copy_streams_change_nothing(problem):
    """No stage offloads: every engine gives the fast evaluator's numbers (the model
    without copies) to the last digit, and records no copy."""
    table = op_table(compile_schedule(problem.schedule), problem.stage_costs,
                     problem.hardware.transfer_ms)
    layers = [problem.split.rank_layers(r) for r in range(problem.split.pp)]
    want = evaluate(table, layers, problem.hardware.memory_bytes)
    for p in (problem, offloaded(problem, 0.0, 1.0)):
        for sim in (simulate(p), simpy_engine.simulate(p)):
            assert sim.summary == want
            assert sim.timeline is not None and sim.timeline.copies == ()


@settings(max_examples=60, deadline=None)
@given(random_problems(), fractions)
def test_instant_copies_keep_every_time_and_never_raise_a_peak(problem, frac):
    plain = simulate(problem)
    free = simulate(offloaded(problem, frac, 0.0))
    assert free.timeline.ops == plain.timeline.ops
    for a, b in zip(free.summary.ranks, plain.summary.ranks, strict=True):
        assert a.peak_memory_bytes <= b.peak_memory_bytes


def sweep_peaks(sim) -> list[int]:
    """Each rank's activation peak rebuilt from the recorded ops and copies alone, by the
    rule at one instant: copies asked for earlier first (releases, then allocations),
    then the ops' own changes in their order, a reload that starts as it is asked for
    right after the start of the op that asked for it."""
    table = sim.problem.stage_costs
    split = sim.problem.schedule.split_backward
    changes: list[list[tuple[float, int, int, int]]] = [[] for _ in sim.timeline.ops]
    asked: dict[tuple[int, int, int], int] = {}
    for r, ops in enumerate(sim.timeline.ops):
        for i, op in enumerate(ops):
            c, a = table[op.action.stage], op.action
            keep = c.weight_grad_bytes if split else 0
            if a.kind == "F":
                changes[r].append((op.start, 2, 3 * i, c.activation_bytes))
            elif a.kind == "B":  # its transient held from its start to its end
                changes[r].append((op.start, 2, 3 * i, c.transient_bytes))
                changes[r].append((op.end, 2, 3 * i + 2,
                                   -(c.activation_bytes - keep + c.transient_bytes)))
                asked[(r, a.stage, a.microbatch)] = 3 * (i - 1) + 1
            else:
                changes[r].append((op.end, 2, 3 * i + 2, -keep))
    for cp in sim.timeline.copies:
        if cp.direction == "offload":
            changes[cp.rank].append((cp.end, 0, 0, -cp.nbytes))
        elif cp.start == cp.issued:
            changes[cp.rank].append((cp.start, 2, asked[(cp.rank, cp.stage, cp.microbatch)],
                                     cp.nbytes))
        else:
            changes[cp.rank].append((cp.start, 1, 0, cp.nbytes))
    peaks = []
    for ch in changes:
        held = best = 0
        for *_, delta in sorted(ch):
            held += delta
            best = max(best, held)
        peaks.append(best)
    return peaks


@settings(max_examples=60, deadline=None)
@given(random_problems(), fractions, st.sampled_from([0.25, 1.0, 4.0]))
def test_peaks_count_the_copies_in_flight_exactly(problem, frac, speed):
    sim = simulate(offloaded(problem, frac, speed))
    for r, want in enumerate(sweep_peaks(sim)):
        assert sim.summary.ranks[r].peak_memory_bytes == sim.timeline.static[r] + want
    for events in sim.timeline.memory:  # back to nothing, in time order
        assert events[-1][1] == 0
        assert [e[0] for e in events] == sorted(e[0] for e in events)


@settings(max_examples=60, deadline=None)
@given(random_problems(), fractions, speeds)
def test_copies_follow_their_ops_and_a_late_reload_stalls_the_backward(problem, frac, speed):
    sim = simulate(offloaded(problem, frac, speed))
    tl = sim.timeline
    f_end = {op.action: op.end for ops in tl.ops for op in ops if op.action.kind == "F"}
    b_start = {(op.action.stage, op.action.microbatch): op.start
               for ops in tl.ops for op in ops if op.action.kind == "B"}
    out = {(c.stage, c.microbatch): c for c in tl.copies if c.direction == "offload"}
    back = {(c.stage, c.microbatch): c for c in tl.copies if c.direction == "reload"}
    assert out.keys() == back.keys()
    for key, c in out.items():
        assert c.start >= f_end[type(next(iter(f_end)))("F", *key)]
        assert back[key].start >= c.end  # back only once it is out
        assert b_start[key] >= back[key].end  # the backward waits for its tensors
    for r in range(problem.schedule.pp):  # one copy at a time per stream and direction
        for d in ("offload", "reload"):
            mine = [c for c in tl.copies if c.rank == r and c.direction == d]
            assert all(a.end <= b.start for a, b in zip(mine, mine[1:], strict=False))


def test_a_copy_longer_than_the_ops_stalls_by_exactly_its_excess():
    """One stage, F 1 ms, B 2 ms, one microbatch, copies of 3 ms each way: the copy out
    ends at 4, the reload (due at F's start) runs 4-7, B runs 7-9 instead of 1-3."""
    p = offloaded(uniform_problem(1, 1, 1, "1f1b", f=1.0, b=2.0, act=10**6), 1.0, 3.0)
    for sim in (simulate(p), simpy_engine.simulate(p)):
        assert [(op.start, op.end) for op in sim.timeline.ops[0]] == [(0.0, 1.0), (7.0, 9.0)]
        assert [(c.direction, c.start, c.end) for c in sim.timeline.copies] == [
            ("offload", 1.0, 4.0), ("reload", 4.0, 7.0)]
        # Held: the whole microbatch from F's start, gone 4-4, back at 4 until B ends.
        assert [e[1] for e in sim.timeline.memory[0]] == [10**6, 0, 10**6, 0]


def test_the_trace_lane_draws_the_simulated_copies():
    p = offloaded(uniform_problem(2, 1, 2, "1f1b", f=1.0, b=2.0, act=10**6, out=0), 0.5, 1.0)
    sim = simulate(p)
    events = copy_events(sim)
    lanes = [e for e in events if e["ph"] == "M"]
    assert {e["args"]["name"] for e in lanes} == {"host copies"}
    copies = [e for e in events if e["ph"] == "X"]
    assert len(copies) == len(sim.timeline.copies) == 2 * 2 * 2
    assert all(e["dur"] == 0.5 * 1e3 for e in copies)  # 0.5 MB at 1 ms per MB


def test_the_planners_estimate_holds_three_microbatches_in_flight():
    c = StageCost(2.0, 3.0, 0.0, 100, 1000, 0, 10, offload_bytes=400, copy_ms=4.0)
    e = estimated(c)
    # F gains what the copy out takes beyond the B after it (4 - 3), B what the copy back
    # takes beyond the F before it (4 - 2).
    assert (e.forward_ms, e.backward_ms) == (3.0, 5.0)
    assert (e.static_bytes, e.activation_bytes, e.offload_bytes) == (1300, 600, 0)  # 100 + 3 x 400


def test_the_planner_reports_an_offloading_plan_as_the_copy_streams_time_it() -> None:
    """The planner's leaves price copies per stage; what it reports for an offloading
    policy is the simulator's copy streams, and it claims no optimality for it."""
    cfg = config_from_dict({"model": {"preset": "llama3-8b"},
                            "hardware": {"preset": "h100-80gb"},
                            "pipeline": {"pp": 4, "microbatches": 8}})
    pc = policy_costs(cfg)
    pols = (StagePolicy(recompute_modules=("core_attn",), offload_modules=("core_attn",),
                        offload_fraction=1.0),) * 4
    problem = replace(build_problem(cfg), costs=pc.base, memory=Fixed(costs=pc, policies=pols))
    r = plan(problem, top_k=1, time_budget_s=5)
    sb = resimulated(SpaceBest(space="megatron", result=r, policies=pols, proven=True))
    exact = simulate(problem.with_split(r.best.split), record=False).summary
    assert sb.result.best.summary == exact and not sb.proven and sb.copies == RESIMULATED
    # The last stage runs each B right after its F: the reload waits for the copy out,
    # which the per-stage estimate does not see.
    assert exact.iteration_time_ms > r.best.summary.iteration_time_ms


def test_free_copies_keep_the_offloaded_tensors_off_the_device() -> None:
    """No host link: the executor copies synchronously, each tensor leaves as it is saved
    and comes back as the backward uses it; the stage holds the rest and no stream runs."""
    plain = uniform_problem(2, 1, 4, "1f1b", f=1.0, b=2.0, act=10**6, out=0)
    free = offloaded(plain, 0.25, 0.0)
    for sim in (simulate(free), simpy_engine.simulate(free)):
        assert sim.timeline.copies == ()
        assert sim.timeline.ops == simulate(plain).timeline.ops
        # Rank 0 holds 2 microbatches under 1F1B on 2 ranks, each 750,000 bytes.
        assert sim.summary.ranks[0].peak_activation_bytes == 2 * 750_000


def test_a_woken_backward_never_starts_before_its_reload_ends() -> None:
    now, ready = 17.490470923116597, 101.3455145796802
    assert now + (ready - now) < ready  # the plain difference rounds below `ready`
    delay = wake_delay(now, ready)
    assert now + delay >= ready > now + math.nextafter(delay, -math.inf)


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_the_wake_delay_is_the_least_that_reaches_ready(a, b):
    now, ready = min(a, b), max(a, b)
    delay = wake_delay(now, ready)
    assert now + delay >= ready
    assert now + math.nextafter(delay, -math.inf) < ready or delay == ready - now
