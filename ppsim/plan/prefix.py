"""The exact time of a partly placed split's relaxation: the planner's tightest bound.

Stages 0..k-1 are placed; the rest are dropped from their ranks and replaced by one
delay (prefix_time). Which ops remain, their messages and delays depend on k alone, so
they are built once per k (placed_ops) and only the durations and the trip's delay are
filled in per split.
"""

from __future__ import annotations

from typing import NamedTuple

from ppsim.pipeline import messages
from ppsim.plan.bounds import ROUNDING, PathBounds
from ppsim.plan.search import SplitSearch
from ppsim.sim.evaluate import list_schedule

PLACED_CACHE = 1 << 22
"""Ops the per-k templates keep, over every k (beyond it they are built per call)."""
KIND_SLOT = {"F": 0, "B": 1, "W": 2}
"""Where an op's duration sits among a placement's F, B and W durations."""


class _Sub(NamedTuple):
    """The part of a compiled schedule list_schedule reads."""

    kind: list[tuple[str, ...]]
    wait_key: list[tuple[int, ...]]
    send_key: list[tuple[int, ...]]
    messages: int


class PlacedOps(NamedTuple):
    """The ops of the first k stages on each rank, as prefix_time schedules them: all
    but their durations and the trip's delay, which depend on the split."""

    sub: _Sub
    slots: list[list[int]]
    """Per rank, each op's index into the k stages' F, then B, then W durations."""
    delays: list[list[float]]
    """Per rank, each op's message delay (0.0 where the trip goes)."""
    trips: list[list[int]]
    """Per rank, the ops of stage k-1's F: their message is the trip back to its B."""


def placed_ops(s: SplitSearch, k: int) -> PlacedOps:
    """The ops of stages 0..k-1 (prefix_time's relaxation), their messages and delays."""
    kinds, waits, sends, slots, delays, trips = [], [], [], [], [], []
    for r in range(s.pp):
        k_, w_, s_, sl_, dl_, tr_ = [], [], [], [], [], []
        for a, kd, wk, sk, sdl in zip(s.sched.actions[r], s.compiled.kind[r],
                                      s.compiled.wait_key[r], s.compiled.send_key[r],
                                      s.send_delay[r], strict=True):
            if a.stage >= k:
                continue  # an unplaced stage: part of the free delay
            if a.stage == k - 1 and kd == "F":  # straight back to its own B
                sk, sdl = messages.key(a.stage, a.microbatch, True, s.m), 0.0
                tr_.append(len(k_))
            k_.append(kd)
            w_.append(wk)
            s_.append(sk)
            sl_.append(KIND_SLOT[kd] * k + a.stage)
            dl_.append(sdl)
        kinds.append(tuple(k_))
        waits.append(tuple(w_))
        sends.append(tuple(s_))
        slots.append(sl_)
        delays.append(dl_)
        trips.append(tr_)
    return PlacedOps(_Sub(kinds, waits, sends, s.compiled.messages), slots, delays, trips)


class PrefixTimes:
    """prefix_time of one search, its per-k templates kept while they fit PLACED_CACHE
    ops (the search asks for every k again and again)."""

    def __init__(self, paths: PathBounds) -> None:
        self.paths = paths
        self._placed: dict[int, PlacedOps] = {}
        self._kept = 0

    def placed(self, k: int) -> PlacedOps:
        found = self._placed.get(k)
        if found is None:
            found = placed_ops(self.paths.s, k)
            ops = sum(len(sl) for sl in found.slots)
            if self._kept + ops <= PLACED_CACHE:
                self._placed[k] = found
                self._kept += ops
        return found

    def __call__(self, counts: list[int]) -> float:
        return prefix_time(self.paths, counts, self.placed(len(counts)))


def prefix_time(paths: PathBounds, counts: list[int], ops: PlacedOps | None = None) -> float:
    """Exact time of a relaxation: stages 0..k-1 as placed, the rest free of ranks.

    The unplaced stages (always the last ones: the search places stages in
    order) are dropped from their ranks and replaced by one delay: a
    microbatch's forward through all of them and its gradient back take their
    summed F and B time (known from the layers left, whatever the split)
    without waiting for any rank. Dropping constraints only makes ops start
    earlier, so this never exceeds the real time; it captures every
    interaction among the placed stages (such as several equally loaded ranks
    in a row). Cost: one list schedule of the placed ops (`ops`: placed_ops of
    these k stages, built here when not given).
    """
    k = len(counts)
    s = paths.s
    pos, costs = 0, []
    for i, n in enumerate(counts):
        costs.append(s.stage(pos, n, i))
        pos += n
    head = s.costs.head
    rest_f = paths.pre_f[-1] - paths.pre_f[pos] + head.forward_ms
    rest_b = paths.pre_b[-1] - paths.pre_b[pos] + paths.bpart(head)
    trip = rest_f + rest_b + 2 * (paths.pre_d[-1] - paths.pre_d[k - 1])  # k-1 -> end -> k-1
    # Each op as short as in a pair (pair_saving_ms less); pairs' constraints dropped too.
    flat = [c.forward_ms - c.pair_saving_ms for c in costs] \
        + [paths.bpart(c) - c.pair_saving_ms for c in costs] \
        + [c.weight_grad_ms if s.split_bw else 0.0 for c in costs]
    if ops is None:
        ops = placed_ops(s, k)
    durations = [[flat[j] for j in sl] for sl in ops.slots]
    delays = ops.delays
    if any(ops.trips):
        delays = [list(d) for d in delays]
        for d, tr in zip(delays, ops.trips, strict=True):
            for i in tr:
                d[i] = trip
    _, ends = list_schedule(ops.sub, durations, delays)  # type: ignore[arg-type]
    return max((e[-1] for e in ends if e), default=0.0) * ROUNDING
