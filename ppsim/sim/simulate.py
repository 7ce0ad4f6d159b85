"""One iteration of a resolved problem, on the engine its placement needs.

A placement where every rank has its own device and link runs `ppsim.sim.engine.Engine`;
one that shares devices or links runs `ppsim.sim.shared.SharedEngine`, the same processes
over shared resources (equal to the private engine when nothing is shared).
"""

from __future__ import annotations

import gc

from ppsim.pipeline.problem import Problem
from ppsim.sim.engine import Records, Simulation, finished, run
from ppsim.sim.shared import SharedEngine
from ppsim.sim.timing import p2p_link, stage_table


def simulate(problem: Problem, record: bool = True) -> Simulation:
    """Simulate one iteration of a resolved problem.

    With record=False no per-op records are kept (timeline None): memory
    stays proportional to the schedule, not to what happened.
    """
    sched = problem.schedule
    table = stage_table(sched, problem.stage_costs)
    records = Records(sched.pp) if record else None
    # Millions of short-lived objects: the cyclic GC would only rescan them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        topo = problem.topology
        if topo is None or topo.is_private:
            ranks = run(sched, table, p2p_link(problem.hardware.transfer_ms), records)
        else:
            ranks = SharedEngine(sched, table, topo, records).run()
    finally:
        if enabled:
            gc.enable()
    return finished(problem, table.static, ranks, records)
