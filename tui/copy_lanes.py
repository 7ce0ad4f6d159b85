"""Timeline lanes of the host copies a memory policy's offload runs (ppsim.sim.copies).

Each device has two copy streams, one each way; each is first in, first out, so its
copies never overlap and one lane per stream draws them: `out3` (device to host,
after the F; kind "O") and `in3` (back, before the B; kind "R"), under rank 3. A
rank whose stages offload nothing (or copies that take no time) has no copy lanes.
"""

from __future__ import annotations

from typing import Any

from ppsim.tui.lanes import Lane, LaneOp

STREAMS = (("offload", "out", "O"), ("reload", "in", "R"))
"""(Copy.direction, lane label prefix, op kind) of each stream."""


def copy_lanes(sim: Any) -> list[Lane]:
    """The copy streams' lanes of a Simulation, sorted by rank then stream; none
    when nothing was offloaded or the timeline was not recorded."""
    timeline = getattr(sim, "timeline", None)
    copies = getattr(timeline, "copies", ()) or ()
    if not copies:
        return []
    stages = sim.problem.split.stages
    lanes = []
    for rank in sorted({c.rank for c in copies}):
        for direction, prefix, kind in STREAMS:
            ops = sorted((LaneOp(c.start, c.end, kind, stages[c.stage].chunk, c.microbatch,
                                 c.stage)
                          for c in copies if c.rank == rank and c.direction == direction),
                         key=lambda o: o.start)
            if ops:
                lanes.append(Lane(f"{prefix}{rank}", tuple(ops), rank, "copy"))
    return lanes
