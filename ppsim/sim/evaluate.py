"""Fast evaluator: list scheduling over the fixed per-rank order, no event queue.

Each op starts at max(end of the rank's previous op, arrival of its input)
and ends start + duration; a message arrives at the sender's end + delay.
That is exactly what the event-driven simulator computes, with the same float
operations, so the two agree to the last digit (tests/property/test_simulator.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from ppsim.sim.summary import Summary, busy_ms, memory_peaks, summarize
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
    arrival: dict[int, float] = {}
    waiting: dict[int, int] = {}  # message key -> rank blocked on it
    pos = [0] * pp
    clock = [0.0] * pp
    ready = list(range(pp - 1, -1, -1))
    while ready:
        r = ready.pop()
        waits, sends, dur, delay = c.wait_key[r], c.send_key[r], duration[r], send_delay[r]
        paired = pairs[r] if pairs else frozenset()
        i, now, n = pos[r], clock[r], len(waits)
        st, en = starts[r], ends[r]
        while i < n:
            key = waits[i]
            if key >= 0:
                t = arrival.get(key)
                if t is None:
                    waiting[key] = r
                    break
                if t > now:
                    now = t
            if paired and i in paired:  # a paired F starts once its B's input is in too
                key = waits[i + 1]
                if key >= 0:
                    t = arrival.get(key)
                    if t is None:
                        waiting[key] = r
                        break
                    if t > now:
                        now = t
            st.append(now)
            now = now + dur[i]
            en.append(now)
            if paired and i in paired:  # its message leaves with its B's, when the B ends
                i += 1
                continue
            j = i - 1 if paired and i - 1 in paired else i
            while j <= i:
                key = sends[j]
                if key >= 0:
                    arrival[key] = now + delay[j]
                    blocked = waiting.pop(key, None)
                    if blocked is not None:
                        ready.append(blocked)
                j += 1
            i += 1
        pos[r], clock[r] = i, now
    if any(pos[r] < len(c.wait_key[r]) for r in range(pp)):
        raise RuntimeError("schedule deadlocks")
    return starts, ends


def evaluate(table: OpTable, layers: list[int], memory_bytes: float,
             tail: list[float] | None = None, boundary: float = 0.0) -> Summary:
    """Iteration time, bubbles and memory peaks, without building a timeline; `tail` is
    the step's per-rank end (see summary.step_tail)."""
    _, ends = op_times(table)
    busy = [busy_ms(durs) for durs in table.duration]
    last = [e[-1] if e else 0.0 for e in ends]
    peaks = [memory_peaks(table.compiled.kind[r], table.alloc[r], table.free[r])
             for r in range(len(ends))]
    return summarize(table.static, last, busy, layers, memory_bytes, peaks, tail, boundary)
