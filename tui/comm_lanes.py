"""Timeline lanes of the collectives inside each rank's ops (ppsim.job.lanes).

A job with tensor, context or expert parallelism runs collectives inside every F and
B: one lane per rank, `comm3` under rank 3, draws them (kind "C") from each op's
start, group after group, as the trace's collectives thread does
(ppsim.trace.schema.collective_events). A lone replica, or a job whose groups are
all of size 1, has no such lanes.
"""

from __future__ import annotations

from typing import Any

from ppsim.job.lanes import problem_collectives
from ppsim.trace.schema import collective_events
from ppsim.tui.lanes import Lane, LaneOp


def comm_lanes(sim: Any) -> list[Lane]:
    """A Simulation's collectives lanes, one per rank that has any; none when the
    timeline was not recorded or nothing communicates."""
    ops_by_rank = getattr(getattr(sim, "timeline", None), "ops", None)
    comm = problem_collectives(sim.problem) if ops_by_rank else []
    if not comm:
        return []
    stages = sim.problem.split.stages
    lanes = []
    for rank, ops in enumerate(ops_by_rank):
        strips = [LaneOp(e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, "C",
                         stages[op.action.stage].chunk, op.action.microbatch, op.action.stage)
                  for op in ops
                  for e in collective_events(rank, op.action.kind, op.action.stage,
                                             op.action.microbatch, op.start * 1e3,
                                             op.end * 1e3, comm[op.action.stage])]
        if strips:
            lanes.append(Lane(f"comm{rank}", tuple(sorted(strips, key=lambda o: o.start)),
                              rank, "comm"))
    return lanes
