"""One iteration of a resolved problem, on the engine its placement needs.

A placement where every rank has its own device and link runs `ppsim.sim.engine.Engine`;
one that shares devices or links runs `ppsim.sim.shared.SharedEngine`, the same processes
over shared resources (equal to the private engine when nothing is shared).
"""

from __future__ import annotations

import gc

from ppsim.pipeline.problem import Problem
from ppsim.sim.engine import Records, Simulation, Timeline, run
from ppsim.sim.shared import SharedEngine
from ppsim.sim.summary import step_parts, summarize
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
    stuck = [r for r, rr in enumerate(ranks) if rr.ops != len(sched.actions[r])]
    if stuck:
        raise RuntimeError(f"schedule deadlocked on ranks {stuck}")
    layers = [problem.split.rank_layers(r) for r in range(sched.pp)]
    hw = problem.hardware
    parts = step_parts(sched, problem.stage_costs, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps,
                       hw.memory_bandwidth_gbps, hw.dp, hw.optimizer_fixed_ms)
    tail = [r + o for r, o in parts]
    summary = summarize(table.static, [rr.end for rr in ranks], [rr.busy for rr in ranks],
                        layers, hw.memory_bytes,
                        [(rr.peak_activation, rr.peak_inflight) for rr in ranks], tail,
                        hw.iteration_boundary_ms)
    timeline = None
    if records is not None:
        timeline = Timeline(tuple(tuple(o) for o in records.ops), tuple(records.transfers),
                            tuple(tuple(mm) for mm in records.memory), table.static,
                            tuple((rr.end, *p) for rr, p in zip(ranks, parts, strict=True)))
    return Simulation(problem, summary, timeline)
