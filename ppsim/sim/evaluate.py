"""Fast evaluator: list scheduling over the fixed per-rank order, no event queue.

Each op starts at max(end of the rank's previous op, arrival of its input)
and ends start + duration; a message arrives at the sender's end + delay.
That is exactly what the event-driven simulator computes, with the same float
operations, so the two agree to the last digit (tests/property/test_simulator.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ppsim.sim.summary import StepPart, Summary, busy_ms, memory_peaks, summarize
from ppsim.sim.timing import CompiledSchedule, OpTable


def op_times(table: OpTable) -> tuple[list[list[float]], list[list[float]]]:
    """Start and end time of every op, per rank. Raises RuntimeError on deadlock."""
    return list_schedule(table.compiled, table.duration, table.send_delays(),
                         table.compiled.schedule.pairs)


def list_schedule(c: CompiledSchedule, duration: Sequence[Sequence[float]],
                  send_delay: Sequence[Sequence[float]],
                  pairs: Sequence[frozenset[int]] = ()
                  ) -> tuple[list[list[float]], list[list[float]]]:
    """Start and end times given per-op durations and message delays; `pairs` per rank
    as Schedule.pairs (a paired F waits for its B's input too, its message leaves with
    the B's)."""
    pp = len(c.kind)
    starts: list[list[float]] = [[] for _ in range(pp)]
    ends: list[list[float]] = [[] for _ in range(pp)]
    # Indexed by message key (a list reads faster than a dict in this, the planner's
    # innermost loop); None: not sent yet.
    arrival: list[float | None] = [None] * c.messages
    waiting: dict[int, int] = {}  # message key -> rank blocked on it
    pos = [0] * pp
    clock = [0.0] * pp
    ready = list(range(pp - 1, -1, -1))
    while ready:
        r = ready.pop()
        waits, sends, dur, delay = c.wait_key[r], c.send_key[r], duration[r], send_delay[r]
        st, en = starts[r], ends[r]
        if pairs and pairs[r]:
            pos[r], clock[r] = _paired_rank(_Rank(r, waits, sends, dur, delay, pairs[r], st, en),
                                            pos[r], clock[r], arrival, waiting, ready)
            continue
        i, now, n = pos[r], clock[r], len(waits)
        while i < n:
            key = waits[i]
            if key >= 0:
                t = arrival[key]
                if t is None:
                    waiting[key] = r
                    break
                if t > now:
                    now = t
            st.append(now)
            now = now + dur[i]
            en.append(now)
            key = sends[i]
            if key >= 0:
                arrival[key] = now + delay[i]
                blocked = waiting.pop(key, None)
                if blocked is not None:
                    ready.append(blocked)
            i += 1
        pos[r], clock[r] = i, now
    if any(pos[r] < len(c.wait_key[r]) for r in range(pp)):
        raise RuntimeError("schedule deadlocks")
    return starts, ends


class _Rank(NamedTuple):
    """One rank's ops as list_schedule reads them."""

    rank: int
    waits: Sequence[int]
    sends: Sequence[int]
    dur: Sequence[float]
    delay: Sequence[float]
    paired: frozenset[int]
    starts: list[float]
    ends: list[float]


def _paired_rank(k: _Rank, i: int, now: float, arrival: list[float | None],
                 waiting: dict[int, int], ready: list[int]) -> tuple[int, float]:
    """list_schedule's walk of one rank whose order has combined pairs, from op i at
    `now` until an input is missing: a paired F starts once its B's input is in too, and
    its message leaves with the B's. Returns where it stopped."""
    n = len(k.waits)
    while i < n:
        last = i + 1 if i in k.paired else i
        for j in range(i, last + 1):
            key = k.waits[j]
            if key >= 0:
                t = arrival[key]
                if t is None:
                    waiting[key] = k.rank
                    return i, now
                now = max(now, t)
        k.starts.append(now)
        now = now + k.dur[i]
        k.ends.append(now)
        if i not in k.paired:
            for j in range(i - 1 if i - 1 in k.paired else i, i + 1):
                key = k.sends[j]
                if key >= 0:
                    arrival[key] = now + k.delay[j]
                    blocked = waiting.pop(key, None)
                    if blocked is not None:
                        ready.append(blocked)
        i += 1
    return i, now


def evaluate(table: OpTable, layers: list[int], memory_bytes: float,
             parts: Sequence[StepPart] | None = None, boundary: float = 0.0) -> Summary:
    """Iteration time, bubbles and memory peaks, without building a timeline; `parts` is
    the step's per-rank tail (summary.step_parts)."""
    _, ends = op_times(table)
    busy = [busy_ms(durs) for durs in table.duration]
    last = [e[-1] if e else 0.0 for e in ends]
    peaks = [memory_peaks(table.compiled.kind[r], table.alloc[r], table.free[r])
             for r in range(len(ends))]
    return summarize(table.static, last, busy, layers, memory_bytes, peaks, parts, boundary)
