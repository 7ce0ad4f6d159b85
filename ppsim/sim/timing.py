"""What both timing engines share: per-op durations, messages and memory deltas.

The discrete-event simulator (`ppsim.simulator`) and the fast evaluator
(`ppsim.evaluate`) take every duration, byte count and message delay from
the same `StageTable` and link, so they compute every time with the same
floating-point operations in the same order and agree to the last digit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppsim.costs.model import StageCost
from ppsim.schedules.generators import B, F, Schedule, W


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
class StageTable:
    """Per virtual stage, what one op of each kind costs: the op table before it is
    spread over the schedule. The simulator reads this directly (no per-op table),
    so its memory does not grow with the run.
    """

    duration: dict[str, tuple[float, ...]]
    """Kind -> per-stage duration of one op of that kind."""
    alloc: tuple[int, ...]
    """Activation bytes an F allocates when it starts."""
    free: dict[str, tuple[int, ...]]
    """Kind -> bytes released when the op ends (B: all W does not keep; W: the rest)."""
    boundary_bytes: tuple[int, ...]
    """Bytes crossing the boundary between stage s and s + 1 (activation and gradient)."""
    static: tuple[int, ...]
    """Static bytes per rank."""


def stage_table(s: Schedule, costs: Sequence[StageCost]) -> StageTable:
    """Per-stage durations, memory deltas and message sizes of a schedule's stages."""
    dur_b = tuple(c.input_grad_ms(s.split_backward) for c in costs)
    if s.split_backward:
        # What W keeps: matmul inputs and their output gradients. The gradients are new
        # tensors, so this may exceed what B frees (B then raises memory).
        keep = tuple(c.weight_grad_bytes for c in costs)
    else:
        keep = (0,) * len(costs)
    static = [0] * s.pp
    for i, c in enumerate(costs):
        static[s.stage_rank(i)] += c.static_bytes
    act = tuple(c.activation_bytes for c in costs)
    return StageTable(
        duration={F: tuple(c.forward_ms for c in costs), B: dur_b,
                  W: tuple(c.weight_grad_ms for c in costs)},
        alloc=act,
        free={F: (0,) * len(costs), B: tuple(a - k for a, k in zip(act, keep, strict=True)),
              W: keep},
        boundary_bytes=tuple(c.output_bytes for c in costs), static=tuple(static))


Link = Callable[[int, int, int], float]
"""link(src rank, dst rank, bytes) -> delay from send to arrival, in ms."""


def p2p_link(transfer_ms: Callable[[int], float]) -> Link:
    """Private links between ranks; a boundary inside one rank (V placement) is free."""
    cache: dict[int, float] = {}

    def link(src: int, dst: int, nbytes: int) -> float:
        if src == dst:
            return 0.0
        d = cache.get(nbytes)
        if d is None:
            d = cache[nbytes] = transfer_ms(nbytes)
        return d

    return link


@dataclass(frozen=True)
class OpTable:
    """Per rank, per op: duration, message (dst rank in `compiled`, bytes), memory change.

    Built for the fast evaluator and the TUI; `simulate` streams from a
    `StageTable` instead, so huge runs never materialise this.
    """

    compiled: CompiledSchedule
    duration: tuple[tuple[float, ...], ...]
    send_bytes: tuple[tuple[int, ...], ...]
    """Bytes of the message the op sends (0 for none, or inside one rank)."""
    alloc: tuple[tuple[int, ...], ...]
    """Bytes allocated when the op starts (activations, at F)."""
    free: tuple[tuple[int, ...], ...]
    """Bytes released when the op ends (at B, and at W for what W kept)."""
    static: tuple[int, ...]
    """Static bytes per rank."""
    link: Link
    """Delay of a message from its (src, dst, bytes)."""

    def send_delays(self) -> list[list[float]]:
        """Per op: arrival delay of its message (0.0 when it sends none)."""
        link = self.link
        out = []
        for r, (dsts, nbs) in enumerate(zip(self.compiled.send_rank, self.send_bytes,
                                            strict=True)):
            out.append([link(r, d, nb) if d >= 0 else 0.0 for d, nb in zip(dsts, nbs,
                                                                         strict=True)])
        return out


def op_table(compiled: CompiledSchedule, costs: Sequence[StageCost],
             transfer_ms: Callable[[int], float]) -> OpTable:
    """Durations and bytes of every op; transfer_ms(nbytes) gives a message's delay."""
    s = compiled.schedule
    st = stage_table(s, costs)
    durations, nbytes, allocs, frees = [], [], [], []
    zero = (0,) * len(costs)
    for r in range(s.pp):
        kinds, stages = compiled.kind[r], compiled.stage[r]
        durations.append(tuple(st.duration[k][i] for k, i in zip(kinds, stages, strict=True)))
        allocs.append(tuple((st.alloc if k == F else zero)[i]
                            for k, i in zip(kinds, stages, strict=True)))
        frees.append(tuple(st.free[k][i] for k, i in zip(kinds, stages, strict=True)))
        nbytes.append(tuple(st.boundary_bytes[ss] if ss >= 0 and dst != r else 0
                            for ss, dst in zip(compiled.send_stage[r], compiled.send_rank[r],
                                               strict=True)))
    return OpTable(compiled, tuple(durations), tuple(nbytes), tuple(allocs), tuple(frees),
                   st.static, p2p_link(transfer_ms))


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


ADAM_BYTES_PER_PARAM = 28
"""AdamW's step reads the fp32 parameter, gradient and two moments (16 B) and writes
the parameter and the moments (12 B): memory-bound."""
GRAD_BYTES = 4
"""Gradients are reduced in fp32 (Megatron's main grads)."""


def step_parts(s: Schedule, costs: Sequence[StageCost], latency_ms: float,
               bandwidth_gbps: float, memory_bandwidth_gbps: float,
               dp: int, optimizer_fixed_ms: float = 0.0) -> list[tuple[float, float]]:
    """Per rank, what follows its last backward, as (R, S) ms: the data-parallel gradient
    all-reduce (a ring: 2(dp-1)/dp of the gradient bytes, 2(dp-1) latencies) and the
    optimizer step (a fixed time, measured by `ppsim profile` on CPU, plus
    ADAM_BYTES_PER_PARAM over memory bandwidth), as the executor records them.
    Parameters come from the cost model; a cost file without them costs nothing."""
    params = [0] * s.pp
    for i, c in enumerate(costs):
        params[s.stage_rank(i)] += c.params
    out = []
    for n in params:
        reduce = 0.0
        if dp > 1:
            reduce = 2 * (dp - 1) * latency_ms
            if bandwidth_gbps > 0:
                reduce += 2 * (dp - 1) / dp * n * GRAD_BYTES / (bandwidth_gbps * 1e6)
        step = n * ADAM_BYTES_PER_PARAM / (memory_bandwidth_gbps * 1e6) \
            if memory_bandwidth_gbps > 0 else 0.0
        if n and (step or optimizer_fixed_ms):
            step += optimizer_fixed_ms
        out.append((reduce, step))
    return out


def step_tail(s: Schedule, costs: Sequence[StageCost], latency_ms: float,
              bandwidth_gbps: float, memory_bandwidth_gbps: float, dp: int,
              optimizer_fixed_ms: float = 0.0) -> list[float]:
    """Per rank, the time of the step's end (all-reduce then optimizer), see step_parts."""
    return [r + o for r, o in step_parts(s, costs, latency_ms, bandwidth_gbps,
                                         memory_bandwidth_gbps, dp, optimizer_fixed_ms)]


def summarize(static: Sequence[int], ends: list[float], busy: list[float], layers: list[int],
              memory_bytes: float, peaks: list[tuple[int, int]],
              tail: Sequence[float] | None = None, boundary: float = 0.0) -> Summary:
    """Headline numbers from per-rank end times, busy times and memory peaks; `tail`
    (the step's all-reduce and optimizer, per rank) runs after each rank's last op, and
    `boundary` (the executor's end-of-iteration loss all-reduce, measured) separates
    one iteration from the next: the iteration time is a whole iteration, start to
    the next start."""
    if tail is not None and any(tail):
        ends = [e + t for e, t in zip(ends, tail, strict=True)]
        busy = [b + t for b, t in zip(busy, tail, strict=True)]
    pp = len(ends)
    t = (max(ends) + boundary) if ends else 0.0
    ranks = []
    for r in range(pp):
        act, inflight = peaks[r]
        total = static[r] + act
        ranks.append(RankStats(r, layers[r], busy[r], 1.0 - busy[r] / t if t > 0 else 0.0,
                               static[r], act, total, inflight, total <= memory_bytes))
    bubble = 1.0 - sum(busy) / (pp * t) if t > 0 else 0.0
    return Summary(t, bubble, tuple(ranks))
