"""The reference: a discrete-event simulation of per-rank action lists.

One process per rank runs its actions in order. An op waits for the message
carrying its input (ppsim.pipeline.messages says which), computes for its
duration, then hands its own message to the network, which delivers it
`link(src, dst, bytes)` later without blocking the sender (asynchronous
isend/irecv: compute and communication overlap). `Engine` gives every rank its
own device and every message its own link, so messages never queue behind each
other; when a placement shares devices or links, `ppsim.sim.simulate` runs
`ppsim.sim.shared.SharedEngine` instead, the same processes over shared resources.
A combined pair (Schedule.pairs, Megatron's combined 1F1B) is an F that starts once its
B's input is in too and whose message leaves with the B's, when the B ends; each of the
two takes its paired duration (StageTable.paired).
Memory: F allocates its stage's activations when it starts; B allocates its
transient (what lives only inside it) when it starts and releases it and the activations
when it ends (all but what W needs, when W is separate), W releases the rest.
A stage that offloads runs its copies on the rank's copy streams
(ppsim.sim.copies): its B also waits for its tensors to come back.

The event loop is simpy's core and nothing more: one heap of (time, id,
event) with monotone ids, so events at equal times run in the order they
were scheduled and every run is identical. Per-rank statistics (end, busy
time, memory peaks) are kept as the run goes; per-op records (for traces,
pictures and the text timeline) only when asked for, so memory does not
grow with the run otherwise.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple

from ppsim.pipeline.messages import wiring
from ppsim.pipeline.problem import Problem
from ppsim.schedules.generators import Action, B, F, Schedule
from ppsim.schedules.packed import unpacked
from ppsim.sim.copies import Copy, CopyStreams, wake_delay
from ppsim.sim.summary import Summary, step_parts, summarize, sync_waits
from ppsim.sim.timing import Link, StageTable, in_pairs


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
    step: tuple[tuple[float, float, float], ...] = ()
    """Per rank: (end of its last op, R ms, optimizer ms) — the step's tail; R holds the
    wait at the tied embedding's all-reduce, as the executor records it."""
    sync_waits: tuple[float, ...] = ()
    """Per rank, that wait (summary.sync_waits): R's idle part, before the sync."""
    copies: tuple[Copy, ...] = ()
    """Host copies of offloaded activations, in the order they were issued."""


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


class Records:
    """Per-op records, kept only when a timeline is wanted."""

    def __init__(self, pp: int) -> None:
        self.ops: list[list[Op]] = [[] for _ in range(pp)]
        self.transfers: list[Transfer] = []
        self.memory: list[list[tuple[float, int, int]]] = [[] for _ in range(pp)]
        self.copies: list[Copy] = []


def finished(problem: Problem, static: tuple[int, ...], ranks: list[RankRun],
             records: Records | None) -> Simulation:
    """The Simulation of a finished run, whichever engine ran it: the deadlock check, the
    step's tail, the summary and (with records) the timeline."""
    sched = problem.schedule
    stuck = [r for r, rr in enumerate(ranks) if rr.ops != len(sched.actions[r])]
    if stuck:
        raise RuntimeError(f"schedule deadlocked on ranks {stuck}")
    hw = problem.hardware
    parts = step_parts(sched, problem.stage_costs, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps,
                       hw.memory_bandwidth_gbps, hw.dp, hw.optimizer_fixed_ms, hw.job)
    summary = summarize(static, [rr.end for rr in ranks], [rr.busy for rr in ranks],
                        [problem.split.rank_layers(r) for r in range(sched.pp)],
                        hw.memory_bytes,
                        [(rr.peak_activation, rr.peak_inflight) for rr in ranks],
                        parts, hw.iteration_boundary_ms)
    timeline = None
    if records is not None:
        waits = sync_waits([rr.end for rr in ranks], parts)
        step = tuple((rr.end, p.reduce_ms + w + p.sync_ms, p.optimizer_ms)
                     for rr, p, w in zip(ranks, parts, waits, strict=True))
        timeline = Timeline(tuple(tuple(o) for o in records.ops), tuple(records.transfers),
                            tuple(tuple(mm) for mm in records.memory), static, step,
                            copies=tuple(records.copies), sync_waits=tuple(waits))
    return Simulation(problem, summary, timeline)


class Engine:
    """One run with private devices and links: the event heap, the ranks' processes and
    the network between them. SharedEngine overrides how an op computes and how a
    message travels."""

    def __init__(self, schedule: Schedule, table: StageTable, link: Link,
                 records: Records | None, copies: CopyStreams | None = None) -> None:
        pp, n = schedule.pp, schedule.num_stages
        self.copies = copies
        self.woken = [False] * pp
        """Rank r's B was woken by its reload's end (its input had already come)."""
        self.pp = pp
        self.acts = [unpacked(acts) for acts in schedule.actions]  # decoded once, not per op
        self.table, self.records = table, records
        self.owner = [schedule.stage_rank(s) for s in range(n)]
        wired = wiring(n, schedule.microbatches)
        self.waits = wired.waits
        """Kind -> per stage: keys by microbatch of the message its op awaits, or None."""
        self.out = {k: [None if keys is None else (keys, self.owner[wired.to[k][s]],
                                                   wired.boundary[k][s])
                        for s, keys in enumerate(sends)] for k, sends in wired.sends.items()}
        """Kind -> per stage: (keys by microbatch, receiving rank, boundary), or None."""
        # Delay of the message across boundary s (s -> s+1 forward, s+1 -> s backward).
        self.delay = [link(self.owner[s], self.owner[s + 1], table.boundary_bytes[s])
                      for s in range(n - 1)]
        self.heap: list[tuple[float, int, int]] = []  # (time, id, rank | -1 - message key)
        self.ids = 0
        self.arrived: set[int] = set()
        self.waiting: dict[int, int] = {}
        self.pos = [0] * pp
        self.busy = [0.0] * pp
        self.ends = [0.0] * pp
        self.began = [0.0] * pp
        self.act = [0] * pp
        self.inflight = [0] * pp
        self.peak = [0] * pp
        self.peak_in = [0] * pp
        self.pairs = [schedule.paired(r) for r in range(pp)]
        """Per rank: positions of the F actions run combined with the B after them."""
        self.together = [in_pairs(schedule, r) for r in range(pp)]
        """Per rank: positions of every op in a pair (each paired F and its B)."""
        self.held: list[tuple[int, int, int, Action] | None] = [None] * pp
        """Per rank: a paired F's message (dst, key, boundary, action), sent with its B's."""

    def start(self, r: int, now: float) -> None:
        """Start rank r's next op at `now`, or park the rank until its input arrives."""
        a = self.acts[r][self.pos[r]]
        kind, st = a.kind, a.stage
        keys = self.waits[kind][st]
        if keys is not None:
            key = keys[a.microbatch]
            if key not in self.arrived:
                self.waiting[key] = r
                return
        if self.pairs[r] and self.pos[r] in self.pairs[r] and not self._partner_ready(r):
            return
        copies = self.copies
        if copies is not None:
            if kind == B and not self.woken[r]:
                ready = copies.reload_end(r, st, a.microbatch, now)
                if ready > now:  # its tensors are still on their way back
                    self.wake(r, now + wake_delay(now, ready))
                    return
            self.woken[r] = False
            if kind == F or kind == B:  # the copies' changes due by now go first
                self.act[r], self.peak[r] = copies.settle(r, now, self.act[r], self.peak[r],
                                                          self._memory(r), self.inflight[r])
        if keys is not None:
            self.arrived.discard(keys[a.microbatch])
        if kind == F:
            act = self.act[r] = self.act[r] + self.table.alloc[st]
            inflight = self.inflight[r] = self.inflight[r] + 1
            if act > self.peak[r]:
                self.peak[r] = act
            if inflight > self.peak_in[r]:
                self.peak_in[r] = inflight
            if self.records is not None:
                self.records.memory[r].append((now, act, inflight))
        elif kind == B and self.table.transient[st]:  # held until the B ends
            act = self.act[r] = self.act[r] + self.table.transient[st]
            if act > self.peak[r]:
                self.peak[r] = act
            if self.records is not None:
                self.records.memory[r].append((now, act, self.inflight[r]))
        self.began[r] = now
        if copies is not None:
            copies.op_started(r, self.pos[r], now)
            self.act[r], self.peak[r] = copies.settle(r, now, self.act[r], self.peak[r],
                                                      self._memory(r), self.inflight[r])
        self.run_op(r, kind, st, now)

    def _partner_ready(self, r: int) -> bool:
        """A paired F starts once its B's input is in too; else rank r waits for it."""
        b = self.acts[r][self.pos[r] + 1]
        keys = self.waits[b.kind][b.stage]
        if keys is None or keys[b.microbatch] in self.arrived:
            return True
        self.waiting[keys[b.microbatch]] = r
        return False

    def op_ms(self, r: int, kind: str, st: int) -> float:
        """Duration of rank r's current op: alone, or in a combined pair."""
        return self.table.op_ms(kind, st, self.pos[r] in self.together[r])

    def _memory(self, r: int) -> list[tuple[float, int, int]] | None:
        return None if self.records is None else self.records.memory[r]

    def wake(self, r: int, t: float) -> None:
        """Start rank r's op again at t (a B whose reload ends then)."""
        self.ids += 1
        heapq.heappush(self.heap, (t, self.ids, self.pp + r))

    def run_op(self, r: int, kind: str, st: int, now: float) -> None:
        """Rank r computes its op: here alone on its device, so it ends after its duration."""
        d = self.op_ms(r, kind, st) if self.pairs[r] else self.table.duration[kind][st]
        self.busy[r] += d
        self.ids += 1
        heapq.heappush(self.heap, (now + d, self.ids, r))

    def deliver(self, key: int, now: float) -> None:
        r = self.waiting.pop(key, -1)
        self.arrived.add(key)
        if r >= 0:
            self.start(r, now)

    def finish(self, r: int, now: float) -> None:
        """Rank r's op ends: free memory, send its message, start the next op."""
        a = self.acts[r][self.pos[r]]
        kind, st = a.kind, a.stage
        released = self.table.free[kind][st]
        rec = self.records
        copies = self.copies
        if copies is not None and (released or kind == B):
            self.act[r], self.peak[r] = copies.settle(r, now, self.act[r], self.peak[r],
                                                      self._memory(r), self.inflight[r])
        if released or kind == B:
            self.act[r] -= released
            if self.act[r] > self.peak[r]:  # B keeps more for W than it frees
                self.peak[r] = self.act[r]
            if kind == B:
                self.inflight[r] -= 1
            if rec is not None:
                rec.memory[r].append((now, self.act[r], self.inflight[r]))
        if rec is not None:
            rec.ops[r].append(Op(r, a, st // self.pp, self.began[r], now))
        out = self.out[kind][st]
        pairs = self.pairs[r]
        if pairs and self.pos[r] in pairs:  # a paired F's message leaves with its B's
            self.held[r] = None if out is None else (out[1], out[0][a.microbatch], out[2], a)
            out = None
        elif pairs and self.pos[r] - 1 in pairs and self.held[r] is not None:
            dst, key, bound, fa = self.held[r]  # type: ignore[misc]
            self.held[r] = None
            self.send(r, dst, key, bound, fa, now)
        if out is not None:
            keys, dst, bound = out
            self.send(r, dst, keys[a.microbatch], bound, a, now)
        if copies is not None and kind == F:
            copies.forward_ended(r, st, a.microbatch, now)
        self.pos[r] += 1
        if self.pos[r] < len(self.acts[r]):
            self.start(r, now)
        else:
            self.ends[r] = now

    def send(self, r: int, dst: int, key: int, bound: int, a: Action, now: float) -> None:
        """Hand the message across boundary `bound` to the network: a private link."""
        d = self.delay[bound]
        if self.records is not None and dst != r:
            self.records.transfers.append(Transfer(r, dst, a, now, now + d,
                                                   self.table.boundary_bytes[bound]))
        if d == 0.0:
            self.deliver(key, now)
        else:
            self.ids += 1
            heapq.heappush(self.heap, (now + d, self.ids, -1 - key))

    def run(self) -> list[RankRun]:
        heap, pop = self.heap, heapq.heappop
        start, deliver, finish, pp = self.start, self.deliver, self.finish, self.pp
        for r in range(pp):
            if self.acts[r]:
                start(r, 0.0)
        while heap:
            now, _, who = pop(heap)
            if who < 0:
                deliver(-1 - who, now)
            elif who < pp:
                finish(who, now)
            else:
                self.woken[who - pp] = True
                start(who - pp, now)
        return [RankRun(self.ends[r], self.busy[r], self.peak[r], self.peak_in[r], self.pos[r])
                for r in range(self.pp)]


def run(schedule: Schedule, table: StageTable, link: Link,
        records: Records | None = None, copies: CopyStreams | None = None) -> list[RankRun]:
    """Simulate the schedule; per-rank statistics (and `records`, when given)."""
    return Engine(schedule, table, link, records, copies).run()
