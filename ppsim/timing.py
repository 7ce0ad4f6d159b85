"""What both timing engines share: per-op durations, messages and memory deltas.

The simpy simulator (`ppsim.simulator`) and the fast evaluator
(`ppsim.evaluate`) read the same `OpTable`, so they compute every time
with the same floating-point operations in the same order and agree to
the last digit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppsim.costs import StageCost
from ppsim.schedules import B, F, Schedule


@dataclass(frozen=True)
class CompiledSchedule:
    """The structure of a schedule, independent of costs (cached by the planner)."""

    schedule: Schedule
    kind: tuple[tuple[str, ...], ...]
    stage: tuple[tuple[int, ...], ...]
    wait_key: tuple[tuple[int, ...], ...]
    """Message an op must receive before it starts, or -1."""
    send_key: tuple[tuple[int, ...], ...]
    """Message an op sends when it ends, or -1."""
    send_stage: tuple[tuple[int, ...], ...]
    """Stage whose output_bytes size the message (the boundary it crosses)."""
    send_rank: tuple[tuple[int, ...], ...]
    """Receiving rank, or -1."""


def message_key(stage: int, microbatch: int, backward: bool, microbatches: int) -> int:
    """Id of the message that feeds (stage, microbatch) in one direction."""
    return (stage * microbatches + microbatch) * 2 + int(backward)


def compile_schedule(s: Schedule) -> CompiledSchedule:
    n, m = s.num_stages, s.microbatches
    kinds, stages, waits, sends, send_stages, send_ranks = [], [], [], [], [], []
    for acts in s.actions:
        k_, st_, w_, s_, ss_, sr_ = [], [], [], [], [], []
        for a in acts:
            wait = send = sstage = srank = -1
            if a.kind == F:
                if a.stage > 0:
                    wait = message_key(a.stage, a.microbatch, False, m)
                if a.stage < n - 1:
                    send = message_key(a.stage + 1, a.microbatch, False, m)
                    sstage, srank = a.stage, s.stage_rank(a.stage + 1)
            elif a.kind == B:
                if a.stage < n - 1:
                    wait = message_key(a.stage, a.microbatch, True, m)
                if a.stage > 0:
                    send = message_key(a.stage - 1, a.microbatch, True, m)
                    sstage, srank = a.stage - 1, s.stage_rank(a.stage - 1)
            k_.append(a.kind)
            st_.append(a.stage)
            w_.append(wait)
            s_.append(send)
            ss_.append(sstage)
            sr_.append(srank)
        kinds.append(tuple(k_))
        stages.append(tuple(st_))
        waits.append(tuple(w_))
        sends.append(tuple(s_))
        send_stages.append(tuple(ss_))
        send_ranks.append(tuple(sr_))
    return CompiledSchedule(s, tuple(kinds), tuple(stages), tuple(waits), tuple(sends),
                            tuple(send_stages), tuple(send_ranks))


@dataclass(frozen=True)
class OpTable:
    """Per rank, per op: duration, message delay, and memory change."""

    compiled: CompiledSchedule
    duration: tuple[tuple[float, ...], ...]
    send_delay: tuple[tuple[float, ...], ...]
    send_bytes: tuple[tuple[int, ...], ...]
    alloc: tuple[tuple[int, ...], ...]
    """Bytes allocated when the op starts (activations, at F)."""
    free: tuple[tuple[int, ...], ...]
    """Bytes released when the op ends (at B, and at W for what W kept)."""
    static: tuple[int, ...]
    """Static bytes per rank."""


def op_table(compiled: CompiledSchedule, costs: list[StageCost],
             transfer_ms: Callable[[int], float]) -> OpTable:
    """Durations and bytes of every op; transfer_ms(nbytes) gives a message's delay."""
    s = compiled.schedule
    split_bw = s.split_backward
    pp = s.pp
    dur_f = [c.forward_ms for c in costs]
    if split_bw:
        dur_b = [c.backward_ms - c.weight_grad_ms for c in costs]
        keep = [min(c.weight_grad_bytes, c.activation_bytes) for c in costs]
    else:
        dur_b = [c.backward_ms for c in costs]
        keep = [0] * len(costs)
    dur_w = [c.weight_grad_ms for c in costs]
    delay_cache: dict[tuple[int, bool], float] = {}
    durations, delays, nbytes, allocs, frees = [], [], [], [], []
    for r in range(pp):
        d_, dl_, nb_, al_, fr_ = [], [], [], [], []
        for kind, st, sst, srank in zip(compiled.kind[r], compiled.stage[r],
                                        compiled.send_stage[r], compiled.send_rank[r],
                                        strict=True):
            c = costs[st]
            if kind == F:
                d_.append(dur_f[st])
                al_.append(c.activation_bytes)
                fr_.append(0)
            elif kind == B:
                d_.append(dur_b[st])
                al_.append(0)
                fr_.append(c.activation_bytes - keep[st])
            else:
                d_.append(dur_w[st])
                al_.append(0)
                fr_.append(keep[st])
            if sst >= 0:
                b = costs[sst].output_bytes
                same = srank == r  # a boundary inside one rank (V placement) costs nothing
                key = (sst, same)
                if key not in delay_cache:
                    delay_cache[key] = 0.0 if same else transfer_ms(b)
                dl_.append(delay_cache[key])
                nb_.append(0 if same else b)
            else:
                dl_.append(0.0)
                nb_.append(0)
        durations.append(tuple(d_))
        delays.append(tuple(dl_))
        nbytes.append(tuple(nb_))
        allocs.append(tuple(al_))
        frees.append(tuple(fr_))
    static = [0] * pp
    for i, c in enumerate(costs):
        static[s.stage_rank(i)] += c.static_bytes
    return OpTable(compiled, tuple(durations), tuple(delays), tuple(nbytes), tuple(allocs),
                   tuple(frees), tuple(static))


@dataclass(frozen=True)
class RankStats:
    rank: int
    layers: int
    busy_ms: float
    bubble_fraction: float
    static_bytes: int
    peak_activation_bytes: int
    """Activation bytes held at this rank's memory peak."""
    peak_memory_bytes: int
    peak_inflight: int
    fits: bool


@dataclass(frozen=True)
class Summary:
    iteration_time_ms: float
    bubble_fraction: float
    ranks: tuple[RankStats, ...]

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    @property
    def peak_memory_bytes(self) -> int:
        return max(r.peak_memory_bytes for r in self.ranks)


def memory_peaks(table: OpTable, rank: int) -> tuple[int, int]:
    """(peak activation bytes, peak in-flight microbatches) of one rank, in its op order."""
    act = peak = inflight = peak_inflight = 0
    for kind, al, fr in zip(table.compiled.kind[rank], table.alloc[rank], table.free[rank],
                            strict=True):
        act += al
        if kind == F:
            inflight += 1
            if inflight > peak_inflight:
                peak_inflight = inflight
        if act > peak:
            peak = act
        act -= fr
        if kind == B:
            inflight -= 1
    return peak, peak_inflight


def summarize(static: Sequence[int], ends: list[float], busy: list[float], layers: list[int],
              memory_bytes: float, peaks: list[tuple[int, int]]) -> Summary:
    """Headline numbers from per-rank end times, busy times and memory peaks."""
    pp = len(ends)
    t = max(ends) if ends else 0.0
    ranks = []
    for r in range(pp):
        act, inflight = peaks[r]
        total = static[r] + act
        ranks.append(RankStats(r, layers[r], busy[r], 1.0 - busy[r] / t if t > 0 else 0.0,
                               static[r], act, total, inflight, total <= memory_bytes))
    bubble = 1.0 - sum(busy) / (pp * t) if t > 0 else 0.0
    return Summary(t, bubble, tuple(ranks))
