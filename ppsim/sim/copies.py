"""Each device's host copy streams: activation offload as a resource beside compute.

A stage that offloads (`StageCost.offload_bytes`) copies each microbatch's offloaded
tensors to host memory after its F and back before its B, one copy stream each way
per device (a host link is full duplex), each first in, first out:

- **out**: starts when the F ends (or when the stream is free), takes `copy_ms`; the
  tensors leave device memory when it ends;
- **back** (prefetch): issued when the op before the B on the rank starts, starts
  once the copy out has ended and the stream is free; the tensors are on the device
  again from its start; the B waits for its end (a late copy stalls the backward).
  A B whose reload was not prefetched asks for it as it starts.

Copies that take no time (no host link: the executor's synchronous copies on CPU)
hold nothing on the device: the tensors leave as they are saved and come back as the
backward uses them, so the stage simply keeps `activation_bytes - offload_bytes`
(`resident_bytes`, in the stage table) and runs no stream.

Every start and end time follows from the stream's FIFO order when the copy is
issued, so this is bookkeeping shared by every engine (the heap engine, the shared
engine and the simpy reference) rather than events of its own: the engines call
`op_started`, `forward_ended` and `reload_end` at the same points and settle memory
with `settle` before each change of their own and after each `op_started`, which
applies the copies' memory changes due by then in time order (at one instant a
copy's release before its allocation; a reload that starts as it is asked for counts
right after the op whose start asked for it). Peaks count the tensors in flight
exactly. With no stage offloading nothing here runs and every engine gives what it
gave without copies.

`estimated` is the planner's per-stage estimate of the same copies (an F or B
stretched by what a copy takes beyond its neighbour op, COPY_BUFFERS microbatches'
tensors held in flight; not a bound): the planner searches with it and re-simulates what it reports.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ppsim.costs.model import StageCost
from ppsim.schedules.generators import Action, B

COPY_BUFFERS = 3
"""Microbatches' offloaded tensors the planner's estimate holds on the device at once:
an F's own, the previous F's still being copied out, and the reload its start asks for
(1F1B's last warm-up F, before the first B)."""


@dataclass(frozen=True, kw_only=True)
class Copy:
    """One copy on a device's host link, for the timeline and the trace."""

    rank: int
    """The device's rank."""
    direction: str
    """"offload" (device to host, after F) or "reload" (host to device, before B)."""
    stage: int
    """The virtual stage whose tensors move."""
    microbatch: int
    """Their microbatch."""
    start: float
    """When the copy starts (ms)."""
    end: float
    """When it ends (ms)."""
    nbytes: int
    """Bytes moved."""
    issued: float
    """When it was asked for: the F's end (offload), the start of the op before the B
    (reload); it starts later when its stream is busy or, back, its copy out is not done."""


class CopyStreams:
    """The copy streams of every rank of one run (see the module docstring)."""

    def __init__(self, actions: Sequence[Sequence[Action]], costs: Sequence[StageCost],
                 record: bool) -> None:
        pp = len(actions)
        self.acts = actions
        self.off = [streamed(c) for c in costs]
        self.ms = [c.copy_ms for c in costs]
        self.out_free = [0.0] * pp
        self.back_free = [0.0] * pp
        self.out_end: dict[tuple[int, int], float] = {}
        self.back_end: dict[tuple[int, int], float] = {}
        self.pending: dict[tuple[int, int], float] = {}
        """(stage, microbatch) -> when its reload was due, waiting for its copy out."""
        self.deltas: list[list[tuple[float, int, int, int]]] = [[] for _ in range(pp)]
        """Per rank, a heap of (time, 0 release / 1 allocation, order, bytes) to apply."""
        self.order = 0
        self.copies: list[Copy] | None = [] if record else None

    def op_started(self, r: int, i: int, now: float) -> None:
        """Rank r started its op i: prefetch the tensors of the B right after it."""
        acts = self.acts[r]
        if i + 1 >= len(acts):
            return
        a = acts[i + 1]
        if a.kind != B or not self.off[a.stage]:
            return
        key = (a.stage, a.microbatch)
        if key in self.out_end:
            self._reload(r, key, now)
        else:
            self.pending[key] = now  # its F has not ended yet (the op before it)

    def forward_ended(self, r: int, stage: int, microbatch: int, now: float) -> None:
        """An F ended: copy its offloaded tensors out."""
        nbytes = self.off[stage]
        if not nbytes:
            return
        start = max(now, self.out_free[r])
        end = self.out_free[r] = start + self.ms[stage]
        key = (stage, microbatch)
        self.out_end[key] = end
        self._push(r, end, 0, -nbytes)
        self._record(r, "offload", key, start, end, now)
        due = self.pending.pop(key, None)
        if due is not None:
            self._reload(r, key, due)

    def _reload(self, r: int, key: tuple[int, int], due: float) -> None:
        start = max(due, self.out_end.pop(key), self.back_free[r])
        end = self.back_free[r] = start + self.ms[key[0]]
        self.back_end[key] = end
        self._push(r, start, 1, self.off[key[0]])
        self._record(r, "reload", key, start, end, due)

    def reload_end(self, r: int, stage: int, microbatch: int, now: float) -> float:
        """When the B of (stage, microbatch) on rank r, ready at `now`, has its tensors
        back (0.0: nothing moves); a reload not prefetched is asked for now."""
        if not self.off[stage]:
            return 0.0
        key = (stage, microbatch)
        if key not in self.back_end:
            self._reload(r, key, now)
        return self.back_end.pop(key)

    def _push(self, r: int, t: float, kind: int, nbytes: int) -> None:
        self.order += 1
        heapq.heappush(self.deltas[r], (t, kind, self.order, nbytes))

    def _record(self, r: int, direction: str, key: tuple[int, int], start: float,
                end: float, issued: float) -> None:
        if self.copies is not None:
            self.copies.append(Copy(rank=r, direction=direction, stage=key[0],
                                    microbatch=key[1], start=start, end=end,
                                    nbytes=self.off[key[0]], issued=issued))

    def settle(self, r: int, now: float, act: int, peak: int,
               memory: list[tuple[float, int, int]] | None, inflight: int) -> tuple[int, int]:
        """Apply rank r's copy memory changes due by `now`: (activation bytes, peak)."""
        heap = self.deltas[r]
        while heap and heap[0][0] <= now:
            t, _, _, nbytes = heapq.heappop(heap)
            act += nbytes
            if act > peak:
                peak = act
            if memory is not None:
                memory.append((t, act, inflight))
        return act, peak


def wake_delay(now: float, ready: float) -> float:
    """How long after `now` a B that waits for its reload starts: the least delay with
    now + delay >= ready (ready - now alone can round below it), so the B never starts
    before its tensors are back; both engines add it to now (simpy's timeout does), so
    they start it at the same float."""
    delay = ready - now
    while now + delay < ready:
        delay = math.nextafter(delay, math.inf)
    return delay


def streamed(c: StageCost) -> int:
    """Bytes of one microbatch the stage's copy streams move (0: none, or free copies)."""
    return c.offload_bytes if c.copy_ms > 0 else 0


def resident_bytes(c: StageCost) -> int:
    """What an F of the stage allocates on the device: its activations, less what free
    copies keep off it from the start."""
    return c.activation_bytes - (c.offload_bytes - streamed(c))


def offloads(costs: Sequence[StageCost]) -> bool:
    """Some stage runs copies on its copy streams."""
    return any(streamed(c) for c in costs)


def estimated(c: StageCost) -> StageCost:
    """The planner's per-stage estimate of a stage's copies: a copy out overlaps the op
    after the F (a B in the steady state), a copy back the op before the B (an F); what
    a copy takes beyond that op is added to the F or B, and the device holds what stays
    plus COPY_BUFFERS microbatches' offloaded tensors."""
    if not c.offload_bytes:
        return c
    if not streamed(c):  # free copies: exactly what the simulator does with them
        return replace(c, activation_bytes=resident_bytes(c), offload_bytes=0)
    b = c.backward_ms
    stall_f, stall_b = max(0.0, c.copy_ms - b), max(0.0, c.copy_ms - c.forward_ms)
    sb = c.split_backward_ms + stall_b if c.split_backward_ms else 0.0
    return replace(c, forward_ms=c.forward_ms + stall_f, backward_ms=b + stall_b,
                   static_bytes=c.static_bytes + COPY_BUFFERS * c.offload_bytes,
                   activation_bytes=c.activation_bytes - c.offload_bytes,
                   split_backward_ms=sb, offload_bytes=0, copy_ms=0.0)
