"""The tied embedding's gradient all-reduce is a collective between the first and last
stage's ranks (Megatron's _allreduce_word_embedding_grads): the end rank that finishes
its backward first waits there for the other, idle, before its optimizer step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.plan.search import SplitSearch
from ppsim.sim.evaluate import evaluate
from ppsim.sim.simulate import simulate
from ppsim.sim.summary import busy_ms, step_parts
from ppsim.sim.timing import compile_schedule, op_table
from tests.unit.test_tied_embeddings import problem


def _sync_ms(p) -> float:
    return p.hardware.job.embedding_sync_ms(1, (0, 1))


def test_the_head_rank_waits_for_the_embedding_rank_at_the_tied_all_reduce() -> None:
    """1F1B pp 2 at dp 1: rank 0 runs the last backward, so rank 1 (the head) reaches the
    all-reduce first, by the gap between the two ranks' last ops; its R holds that wait,
    its busy time does not."""
    p = problem(True, 2)
    sim = simulate(p)
    tl = sim.timeline
    first, last = (ops[-1].end for ops in tl.ops)
    wait = first - last
    assert wait > 5.0
    sync = _sync_ms(p)
    assert sync > 0
    assert tl.step[0][1] == pytest.approx(sync, rel=1e-12)
    assert tl.step[1][1] == pytest.approx(wait + sync, rel=1e-12)
    for r, ops in enumerate(tl.ops):
        work = busy_ms(op.end - op.start for op in ops)
        assert sim.summary.ranks[r].busy_ms == pytest.approx(work + sync + tl.step[r][2],
                                                             rel=1e-9)


def test_the_wait_sets_the_iteration_time_where_the_early_rank_steps_longer() -> None:
    """Split [2, 22]: the head's rank ends its ops first but steps 11 layers' optimizer
    against rank 0's one: both start the all-reduce at rank 0's end, so the iteration
    ends at rank 0's end + the sync + the head's step (not the head's own end + both)."""
    p = problem(True, 2, [2, 22])
    sim = simulate(p)
    tl = sim.timeline
    ends = [ops[-1].end for ops in tl.ops]
    steps = [s[2] for s in tl.step]
    assert ends[1] < ends[0] and steps[1] - steps[0] > ends[0] - ends[1]
    want = max(ends) + _sync_ms(p) + max(steps) + p.hardware.iteration_boundary_ms
    assert sim.summary.iteration_time_ms == pytest.approx(want, rel=1e-12)
    unsynced = max(e + _sync_ms(p) + s for e, s in zip(ends, steps, strict=True))
    assert sim.summary.iteration_time_ms > unsynced + 1.0


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 23), st.sampled_from([2, 4]))
def test_the_engines_agree_on_the_wait(first: int, pp: int) -> None:
    """The fast evaluator and the planner wait at the tied all-reduce as simulate does."""
    rest = 24 - first
    split = [first, *([rest // (pp - 1)] * (pp - 2)), rest - rest // (pp - 1) * (pp - 2)]
    p = problem(True, pp, split)
    sim = simulate(p)
    hw = p.hardware
    parts = step_parts(p.schedule, p.stage_costs, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps,
                       hw.memory_bandwidth_gbps, hw.dp, hw.optimizer_fixed_ms, hw.job)
    layers = [p.split.rank_layers(r) for r in range(pp)]
    table = op_table(compile_schedule(p.schedule), p.stage_costs, hw.transfer_ms)
    assert evaluate(table, layers, hw.memory_bytes, parts,
                    hw.iteration_boundary_ms) == sim.summary
    assert SplitSearch(p).evaluate(tuple(split)) == sim.summary


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=3, max_size=3),
       st.sampled_from([(False, 2, "1f1b"), (True, 2, "zbv"), (True, 2, "dualpipev"),
                        (False, 4, "1f1b"), (True, 1, "1f1b")]))
def test_no_wait_where_nothing_is_tied_across_ranks(counts: list[int], case) -> None:
    """Untied, or the ends on one rank: the step's tail follows each rank's own last op
    as before, to the last digit."""
    tied, pp, schedule = case
    stages = pp * (2 if schedule != "1f1b" else 1)
    split = {1: None, 2: [counts[0], 24 - counts[0]], 4: [*counts, 24 - sum(counts)]}[stages]
    p = problem(tied, pp, split, schedule=schedule)
    sim = simulate(p)
    hw = p.hardware
    parts = step_parts(p.schedule, p.stage_costs, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps,
                       hw.memory_bandwidth_gbps, hw.dp, hw.optimizer_fixed_ms, hw.job)
    assert all(q.sync_ms == 0.0 for q in parts)
    assert set(sim.timeline.sync_waits) == {0.0}
    ends = [ops[-1].end + q.busy_ms for ops, q in zip(sim.timeline.ops, parts, strict=True)]
    assert sim.summary.iteration_time_ms == max(ends) + hw.iteration_boundary_ms
