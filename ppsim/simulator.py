"""The reference: a discrete-event simulation of per-rank action lists.

One process per rank runs its actions in order. An op waits for the message
carrying its input (the previous stage's activation for F, the next stage's
gradient for B), computes for its duration, then hands its own message to
the network, which delivers it `link(src, dst, bytes)` later without
blocking the sender (asynchronous isend/irecv: compute and communication
overlap; links are not shared, so messages never queue behind each other).
Memory: F allocates its stage's activations when it starts, B releases them
when it ends (all but what W needs, when W is separate), W releases the rest.

The event loop is simpy's core and nothing more: one heap of (time, id,
event) with monotone ids, so events at equal times run in the order they
were scheduled and every run is identical. Per-rank statistics (end, busy
time, memory peaks) are kept as the run goes; per-op records (for traces,
pictures and the text timeline) only when asked for, so memory does not
grow with the run otherwise.
"""

from __future__ import annotations

import gc
import heapq
from dataclasses import dataclass
from typing import NamedTuple

from ppsim.problem import Problem
from ppsim.schedules import Action, B, F, Schedule
from ppsim.timing import Link, StageTable, Summary, p2p_link, stage_table, summarize


class Op(NamedTuple):
    rank: int
    action: Action
    chunk: int
    start: float
    end: float


class Transfer(NamedTuple):
    src: int
    dst: int
    action: Action
    """The op that sent it."""
    start: float
    end: float
    nbytes: int


@dataclass(frozen=True)
class Timeline:
    """Everything that happened in one simulated iteration."""

    ops: tuple[tuple[Op, ...], ...]
    """Per rank, in execution order."""
    transfers: tuple[Transfer, ...]
    memory: tuple[tuple[tuple[float, int, int], ...], ...]
    """Per rank: (time, activation bytes held, in-flight microbatches) after each change."""
    static: tuple[int, ...]


@dataclass(frozen=True)
class RankRun:
    """What one rank did, streamed as the simulation ran."""

    end: float
    busy: float
    peak_activation: int
    peak_inflight: int
    ops: int


@dataclass(frozen=True)
class Simulation:
    problem: Problem
    summary: Summary
    timeline: Timeline | None
    """Per-op records; None when the run was simulated with record=False."""


class _Records:
    """Per-op records, kept only when a timeline is wanted."""

    def __init__(self, pp: int) -> None:
        self.ops: list[list[Op]] = [[] for _ in range(pp)]
        self.transfers: list[Transfer] = []
        self.memory: list[list[tuple[float, int, int]]] = [[] for _ in range(pp)]


def run(schedule: Schedule, table: StageTable, link: Link,
        records: _Records | None = None) -> list[RankRun]:
    """Simulate the schedule; per-rank statistics (and `records`, when given)."""
    pp, m, n = schedule.pp, schedule.microbatches, schedule.num_stages
    acts = schedule.actions
    dur, alloc, free = table.duration, table.alloc, table.free
    owner = [schedule.stage_rank(s) for s in range(n)]
    # Delay of the message across boundary s (s -> s+1 forward, s+1 -> s backward).
    delay = [link(owner[s], owner[s + 1], table.boundary_bytes[s]) for s in range(n - 1)]
    heap: list[tuple[float, int, int]] = []  # (time, id, rank >= 0 | -1 - message key)
    ids = 0
    arrived: set[int] = set()
    waiting: dict[int, int] = {}
    pos = [0] * pp
    busy = [0.0] * pp
    ends = [0.0] * pp
    began = [0.0] * pp
    act = [0] * pp
    inflight = [0] * pp
    peak = [0] * pp
    peak_in = [0] * pp
    push, pop = heapq.heappush, heapq.heappop

    def start(r: int, now: float) -> None:
        """Start rank r's next op at `now`, or park it until its input arrives."""
        nonlocal ids
        a = acts[r][pos[r]]
        kind, st = a.kind, a.stage
        key = -1
        if kind == F and st > 0:
            key = ((st * m + a.microbatch) << 1)
        elif kind == B and st < n - 1:
            key = ((st * m + a.microbatch) << 1) | 1
        if key >= 0:
            if key not in arrived:
                waiting[key] = r
                return
            arrived.discard(key)
        if kind == F:
            act[r] += alloc[st]
            inflight[r] += 1
            if act[r] > peak[r]:
                peak[r] = act[r]
            if inflight[r] > peak_in[r]:
                peak_in[r] = inflight[r]
            if records is not None:
                records.memory[r].append((now, act[r], inflight[r]))
        began[r] = now
        d = dur[kind][st]
        busy[r] += d
        ids += 1
        push(heap, (now + d, ids, r))

    def deliver(key: int, now: float) -> None:
        r = waiting.pop(key, -1)
        arrived.add(key)
        if r >= 0:
            start(r, now)

    for r in range(pp):
        if acts[r]:
            start(r, 0.0)
    while heap:
        now, _, who = pop(heap)
        if who < 0:
            deliver(-1 - who, now)
            continue
        r = who
        a = acts[r][pos[r]]
        kind, st = a.kind, a.stage
        released = free[kind][st]
        if released or kind == B:
            act[r] -= released
            if kind == B:
                inflight[r] -= 1
            if records is not None:
                records.memory[r].append((now, act[r], inflight[r]))
        if records is not None:
            records.ops[r].append(Op(r, a, st // pp, began[r], now))
        to = -1
        if kind == F and st < n - 1:
            to, key, bound = st + 1, ((st + 1) * m + a.microbatch) << 1, st
        elif kind == B and st > 0:
            to, key, bound = st - 1, (((st - 1) * m + a.microbatch) << 1) | 1, st - 1
        if to >= 0:
            d = delay[bound]
            if records is not None and owner[to] != r:
                records.transfers.append(Transfer(r, owner[to], a, now, now + d,
                                                  table.boundary_bytes[bound]))
            if d == 0.0:
                deliver(key, now)
            else:
                ids += 1
                push(heap, (now + d, ids, -1 - key))
        pos[r] += 1
        if pos[r] < len(acts[r]):
            start(r, now)
        else:
            ends[r] = now
    return [RankRun(ends[r], busy[r], peak[r], peak_in[r], pos[r]) for r in range(pp)]


def simulate(problem: Problem, record: bool = True) -> Simulation:
    """Simulate one iteration of a resolved problem.

    With record=False no per-op records are kept (timeline None): memory
    stays proportional to the schedule, not to what happened.
    """
    sched = problem.schedule
    table = stage_table(sched, problem.stage_costs)
    records = _Records(sched.pp) if record else None
    # Millions of short-lived objects: the cyclic GC would only rescan them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        ranks = run(sched, table, p2p_link(problem.hardware.transfer_ms), records)
    finally:
        if enabled:
            gc.enable()
    stuck = [r for r, rr in enumerate(ranks) if rr.ops != len(sched.actions[r])]
    if stuck:
        raise RuntimeError(f"schedule deadlocked on ranks {stuck}")
    layers = [problem.split.rank_layers(r) for r in range(sched.pp)]
    summary = summarize(table.static, [rr.end for rr in ranks], [rr.busy for rr in ranks],
                        layers, problem.hardware.memory_bytes,
                        [(rr.peak_activation, rr.peak_inflight) for rr in ranks])
    timeline = None
    if records is not None:
        timeline = Timeline(tuple(tuple(o) for o in records.ops), tuple(records.transfers),
                            tuple(tuple(mm) for mm in records.memory), table.static)
    return Simulation(problem, summary, timeline)
