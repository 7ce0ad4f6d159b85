"""The collectives lane: a tp / cp / ep job's collectives under each rank, in the
timeline as in the trace (issue 24: "shown in the timeline and the traces")."""

from __future__ import annotations

import pytest

from ppsim.config.overrides import with_overrides
from ppsim.job.lanes import problem_collectives
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.tui.app import PPSimApp
from ppsim.tui.comm_lanes import comm_lanes
from ppsim.tui.testing import preset_config, settle
from ppsim.tui.timeline import Timeline


def _tp4():
    return with_overrides(preset_config("llama3-70b", 4, 8), model={"tp": 4})


def test_each_rank_gets_a_lane_of_the_collectives_inside_its_ops() -> None:
    sim = simulate(build_problem(_tp4()))
    comm = problem_collectives(sim.problem)
    lanes = comm_lanes(sim)
    assert [(lane.label, lane.rank, lane.source) for lane in lanes] == [
        (f"comm{r}", r, "comm") for r in range(4)]
    for lane, ops in zip(lanes, sim.timeline.ops, strict=True):
        assert len(lane.ops) == len(ops)  # one group (tp): one strip per F and per B
        for strip, op in zip(lane.ops, sorted(ops, key=lambda o: o.start), strict=True):
            assert strip.kind == "C" and strip.start == pytest.approx(op.start)
            assert strip.start <= strip.end <= op.end + 1e-9
            sc = comm[op.action.stage]
            want = sum(c.total_ms for c in (sc.forward if op.action.kind == "F"
                                            else sc.backward))
            assert strip.end - strip.start == pytest.approx(min(want, op.end - op.start))


def test_a_lone_replica_has_no_collectives_lane() -> None:
    lone = with_overrides(preset_config("llama3-70b", 4, 8), model={"tp": 1})
    assert comm_lanes(simulate(build_problem(lone))) == []


SIZES = ((80, 24), (160, 45))
"""Each checked in one session: started at the first, resized to the next."""


async def test_the_timeline_draws_the_collectives_under_their_rank() -> None:
    app = PPSimApp(_tp4())
    async with app.run_test(size=SIZES[0]) as pilot:
        for size in SIZES:
            await pilot.resize_terminal(*size)
            await settle(pilot)
            tl = app.query_one(Timeline)
            assert [lane.label for lane in tl.lanes] == [
                "r0", "comm0", "r1", "comm1", "r2", "comm2", "r3", "comm3"], size
            assert any(line.startswith("comm0") for line in tl.text_lines()), size
            await pilot.press("C")
            await settle(pilot)
            assert [lane.label for lane in tl.lanes] == ["r0", "r1", "r2", "r3"]
            await pilot.press("C")
            await settle(pilot)
            assert len(tl.lanes) == 8


async def test_a_data_parallel_job_draws_its_step_collectives() -> None:
    """tp 1, dp 8: no collectives inside the ops, but the step's buckets (D) under each
    rank, the last of them after the rank's last op; before, no lane at all."""
    cfg = with_overrides(preset_config("llama3-8b", 2, 4),
                         model={"tp": 1, "dp": 8, "distributed_optimizer": True},
                         pipeline={"overlap_grad_reduce": True})
    app = PPSimApp(cfg)
    async with app.run_test(size=SIZES[0]) as pilot:
        for size in SIZES:
            await pilot.resize_terminal(*size)
            await settle(pilot)
            tl = app.query_one(Timeline)
            assert [lane.label for lane in tl.lanes] == ["r0", "comm0", "r1", "comm1"]
            lines = {line.split()[0]: line for line in tl.text_lines() if line.strip()}
            assert "D" in lines["comm0"] and "D" in lines["comm1"], size
