"""The simulator as first written on simpy, kept as an oracle for the event loop.

One simpy process per rank walks its action list: wait for the input message,
compute for the op's duration, hand the output message to the network, which
delivers it after the link's delay without blocking the sender. The production
engine (ppsim.simulator) is a hand-written loop of the same model; tests check
the two agree to the last digit.
"""

from __future__ import annotations

import simpy

from ppsim.schedules.generators import B, F, Schedule
from ppsim.sim.timing import Link, StageTable


def simpy_run(s: Schedule, table: StageTable, link: Link) -> list[tuple[float, float, int, int]]:
    """Per rank: (end, busy, peak activation bytes, peak in-flight microbatches)."""
    env = simpy.Environment()
    inbox: dict[tuple[str, int, int], simpy.Event] = {}
    owner = [s.stage_rank(st) for st in range(s.num_stages)]
    out = [(0.0, 0.0, 0, 0)] * s.pp

    def mailbox(key: tuple[str, int, int]) -> simpy.Event:
        if key not in inbox:
            inbox[key] = env.event()
        return inbox[key]

    def deliver(key: tuple[str, int, int], delay: float) -> simpy.Event:
        yield env.timeout(delay)
        mailbox(key).succeed()

    def rank(r: int):
        act = inflight = peak = peak_in = 0
        busy = 0.0
        for a in s.actions[r]:
            if a.kind == F and a.stage > 0:
                yield mailbox((F, a.stage, a.microbatch))
            elif a.kind == B and a.stage < s.num_stages - 1:
                yield mailbox((B, a.stage, a.microbatch))
            if a.kind == F:
                act += table.alloc[a.stage]
                inflight += 1
                peak, peak_in = max(peak, act), max(peak_in, inflight)
            d = table.duration[a.kind][a.stage]
            yield env.timeout(d)
            busy += d
            act -= table.free[a.kind][a.stage]
            inflight -= a.kind == B
            to = a.stage + 1 if a.kind == F else a.stage - 1
            if a.kind != "W" and 0 <= to < s.num_stages:
                bound = min(a.stage, to)
                delay = link(r, owner[to], table.boundary_bytes[bound])
                env.process(deliver((a.kind, to, a.microbatch), delay))
        out[r] = (env.now, busy, peak, peak_in)

    for r in range(s.pp):
        env.process(rank(r))
    env.run()
    return out
