"""One iteration of a resolved problem, on the engine its placement needs.

A placement where every rank has its own device and link runs `ppsim.sim.engine.Engine`;
one that shares devices or links runs `ppsim.sim.shared.SharedEngine`, the same processes
over shared resources (equal to the private engine when nothing is shared).
"""

from __future__ import annotations

import gc
from dataclasses import replace

from ppsim.pipeline.problem import Problem
from ppsim.sim.copies import CopyStreams, offloads
from ppsim.sim.engine import Records, Simulation, finished, run
from ppsim.sim.shared import SharedEngine
from ppsim.sim.timing import p2p_link, stage_table


def simulate(problem: Problem, record: bool = True) -> Simulation:
    """Simulate one iteration of a resolved problem.

    With record=False no per-op records are kept (timeline None): memory
    stays proportional to the schedule, not to what happened.
    """
    sched = problem.schedule
    costs = problem.stage_costs
    table = stage_table(sched, costs)
    records = Records(sched.pp) if record else None
    copies = CopyStreams(sched.actions, costs, record) if offloads(costs) else None
    # Millions of short-lived objects: the cyclic GC would only rescan them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        topo = problem.topology
        if topo is None or topo.is_private:
            ranks = run(sched, table, p2p_link(problem.hardware.transfer_ms), records, copies)
        else:
            ranks = SharedEngine(sched, table, topo, records, copies).run()
    finally:
        if enabled:
            gc.enable()
    if records is not None and copies is not None and copies.copies is not None:
        records.copies = copies.copies
    return finished(problem, table.static, ranks, records)


def between_ops_peaks(problem: Problem) -> list[int]:
    """Each rank's activation peak of what the ops hold between them (Problem.transients
    off): what an executor's trace samples (on CPU it counts saved tensors), which never
    holds what a B holds only while it runs (the head's logit gradient, a recompute's
    tensors). Tests and benchmarks compare a trace's peaks with this."""
    summary = simulate(replace(problem, transients=False), record=False).summary
    return [r.peak_activation_bytes for r in summary.ranks]
