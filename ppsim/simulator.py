"""The reference: a simpy discrete-event simulation of per-rank action lists.

One process per rank runs its actions in order. An op waits for the message
carrying its input (the previous stage's activation for F, the next stage's
gradient for B), computes for its duration, then hands its own message to
the network, which delivers it `latency + bytes / bandwidth` later without
blocking the sender (asynchronous isend/irecv: compute and communication
overlap; links are not shared, so messages never queue behind each other).
Memory: F allocates its stage's activations when it starts, B releases them
when it ends (all but what W needs, when W is separate), W releases the rest.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import NamedTuple

import simpy

from ppsim.problem import Problem
from ppsim.schedules import Action
from ppsim.timing import OpTable, Summary, compile_schedule, op_table, summarize


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
class Simulation:
    problem: Problem
    summary: Summary
    timeline: Timeline


def run_table(table: OpTable) -> tuple[list[float], list[float], list, list, list]:
    """Simulate an op table with simpy; returns per-rank (end, busy, ops, transfers, memory)."""
    c = table.compiled
    sched = c.schedule
    pp = sched.pp
    env = simpy.Environment()
    inbox: dict[int, simpy.Event] = {}
    ends = [0.0] * pp
    busy = [0.0] * pp
    ops: list[list[Op]] = [[] for _ in range(pp)]
    transfers: list[Transfer] = []
    memory: list[list[tuple[float, int, int]]] = [[] for _ in range(pp)]

    def deliver(key: int, delay: float) -> None:
        ev = inbox.get(key)
        if ev is None:
            inbox[key] = env.timeout(delay)
        elif delay == 0.0:
            ev.succeed()
        else:  # the receiver already waits on a placeholder
            env.timeout(delay).callbacks.append(lambda _e, ev=ev: ev.succeed())

    def rank(r: int):
        acts = sched.actions[r]
        waits, sends, dur, delay = c.wait_key[r], c.send_key[r], table.duration[r], \
            table.send_delay[r]
        alloc, free, nbytes, to = table.alloc[r], table.free[r], table.send_bytes[r], \
            c.send_rank[r]
        kinds = c.kind[r]
        act = inflight = 0
        b = 0.0
        mem = memory[r]
        for i in range(len(waits)):
            key = waits[i]
            if key >= 0:
                ev = inbox.get(key)
                if ev is None:
                    ev = inbox[key] = env.event()
                yield ev
            start = env.now
            if kinds[i] == "F":
                act += alloc[i]
                inflight += 1
                mem.append((start, act, inflight))
            yield env.timeout(dur[i])
            b += dur[i]
            end = env.now
            if free[i] or kinds[i] == "B":
                act -= free[i]
                if kinds[i] == "B":
                    inflight -= 1
                mem.append((end, act, inflight))
            if sends[i] >= 0:
                deliver(sends[i], delay[i])
                if to[i] != r:
                    transfers.append(Transfer(r, to[i], acts[i], end, end + delay[i], nbytes[i]))
            ops[r].append(Op(r, acts[i], acts[i].stage // pp, start, end))
        ends[r] = env.now
        busy[r] = b

    for r in range(pp):
        env.process(rank(r))
    # Millions of short-lived objects: the cyclic GC would only rescan them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if enabled:
            gc.enable()
    return ends, busy, ops, transfers, memory


def simulate(problem: Problem) -> Simulation:
    """Simulate one iteration of a resolved problem."""
    table = op_table(compile_schedule(problem.schedule), problem.stage_costs,
                     problem.hardware.transfer_ms)
    ends, busy, ops, transfers, memory = run_table(table)
    if any(len(o) != len(a) for o, a in zip(ops, problem.schedule.actions, strict=True)):
        stuck = [r for r, o in enumerate(ops) if len(o) != len(problem.schedule.actions[r])]
        raise RuntimeError(f"schedule deadlocked on ranks {stuck}")
    peaks = []
    for events in memory:
        peaks.append((max((e[1] for e in events), default=0),
                      max((e[2] for e in events), default=0)))
    layers = [problem.split.rank_layers(r) for r in range(problem.schedule.pp)]
    summary = summarize(table.static, ends, busy, layers, problem.hardware.memory_bytes, peaks)
    timeline = Timeline(tuple(tuple(o) for o in ops), tuple(transfers),
                        tuple(tuple(m) for m in memory), table.static)
    return Simulation(problem, summary, timeline)
