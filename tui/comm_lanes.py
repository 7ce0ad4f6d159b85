"""Timeline lanes of the collectives inside each rank's ops (ppsim.job.lanes).

A job with tensor, context or expert parallelism runs collectives inside every F and
B: one lane per rank, `comm3` under rank 3, draws them (kind "C") from each op's
start, group after group, as the trace's collectives thread does
(ppsim.trace.schema.collective_spans). A data-parallel job's step collectives (kind "D":
the gradient buckets beside the last backward, the parameter gather beside the first
forward; ppsim.job.lanes.step_collective_spans) are on the same lane. A lone replica has
no such lanes. A loaded trace's collectives (a run's, as it timed
them) get lanes of their own, `rcomm3` under `real3`.
"""

from __future__ import annotations

from typing import Any

from ppsim.job.lanes import op_collectives, problem_collectives, step_collective_spans
from ppsim.trace.schema import collective_spans
from ppsim.tui.compare import compared_iteration
from ppsim.tui.lanes import Lane, LaneOp


def comm_lanes(sim: Any) -> list[Lane]:
    """A Simulation's collectives lanes, one per rank that has any; none when the
    timeline was not recorded or nothing communicates."""
    timeline = getattr(sim, "timeline", None)
    ops_by_rank = getattr(timeline, "ops", None)
    if not ops_by_rank:
        return []
    comm = problem_collectives(sim.problem)
    stepped = step_collective_spans(sim.problem, timeline)
    chunk = [st.chunk for st in sim.problem.split.stages]
    lanes = []
    for rank, (ops, steps) in enumerate(zip(ops_by_rank, stepped, strict=True)):
        strips = [LaneOp(s.start_ms, s.start_ms + s.ms, "D", 0, -1, -1) for s in steps]
        if comm:
            strips += [LaneOp(t, t + dur, "C", chunk[a.stage], a.microbatch, a.stage)
                       for op, c in zip(ops, op_collectives(sim.problem, comm, rank),
                                        strict=True)
                       for a in (op.action,)
                       for _, t, dur in collective_spans(a.kind, op.start, op.end, c)]
        if strips:
            lanes.append(Lane(f"comm{rank}", tuple(sorted(strips, key=lambda o: o.start)),
                              rank, "comm"))
    return lanes


def trace_comm_lanes(trace: Any, iteration: int | None = None) -> list[Lane]:
    """A trace's collectives lanes, one per rank that has any, of the iteration
    `trace_lanes` draws (by default the one `ppsim diff` compares), times in ms from its
    first op."""
    it = compared_iteration(trace) if iteration is None else iteration
    ops = [o for o in trace.ops if o.iteration == it]
    if not ops:
        return []
    t0 = min(o.start_us for o in ops)
    chunk = {(o.rank, o.stage): o.chunk for o in ops}
    strips: dict[int, list[LaneOp]] = {}
    for c in trace.collectives:
        if c.iteration == it and c.dur_us > 0:
            strips.setdefault(c.rank, []).append(LaneOp(
                (c.start_us - t0) / 1e3, (c.start_us + c.dur_us - t0) / 1e3,
                "D" if c.op == "R" else "C", chunk.get((c.rank, c.stage), 0), c.microbatch,
                c.stage))
    return [Lane(f"rcomm{r}", tuple(sorted(mine, key=lambda o: o.start)), r, "comm")
            for r, mine in sorted(strips.items())]
