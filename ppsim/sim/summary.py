"""The one summary of an iteration: busy time, bubble, memory peaks and the step's tail.

The event simulator, the fast evaluator and the planner's SplitSearch reduce their
per-rank figures with `summarize`; trace diffs and the executor's run summary take
their bubbles from `bubble_fraction`. Each figure is computed with the same float
operations in the same order wherever it is computed, so the engines agree to the
last digit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ppsim.costs.model import StageCost
from ppsim.costs.state import ADAM_BYTES_PER_PARAM
from ppsim.pipeline.messages import wire_ms
from ppsim.schedules.actions import B, F, Schedule


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
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


def busy_ms(durations: Iterable[float]) -> float:
    """A rank's compute time: its ops' durations summed in execution order (the order
    the event simulator adds them in)."""
    b = 0.0
    for d in durations:
        b += d
    return b


def bubble_fraction(busy: float, span: float) -> float:
    """The part of `span` not spent computing; 0 for an empty span."""
    return 1.0 - busy / span if span > 0 else 0.0


def memory_peaks(kinds: Sequence[str], alloc: Sequence[int], free: Sequence[int]
                 ) -> tuple[int, int]:
    """(peak activation bytes, peak in-flight microbatches) of one rank's ops in order:
    each op allocates when it starts and frees when it ends."""
    act = peak = inflight = peak_inflight = 0
    for kind, al, fr in zip(kinds, alloc, free, strict=True):
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


GRAD_BYTES = 4
"""Gradients are reduced in fp32 (Megatron's main grads)."""


@dataclass(frozen=True, kw_only=True)
class StepPart:
    """One rank's step after its last op, ms, in the order Megatron's finalize_model_grads
    runs it: the data-parallel reduce, the tied embedding's all-reduce, the optimizer."""

    reduce_ms: float
    """The data-parallel gradient reduction (and what ppsim.job.tail adds to it)."""
    sync_ms: float = 0.0
    """The tied embedding's gradient all-reduce between the end ranks; 0 elsewhere."""
    optimizer_ms: float

    @property
    def busy_ms(self) -> float:
        """The step's work: R (reduce and sync) then S; the wait at the sync is idle."""
        return (self.reduce_ms + self.sync_ms) + self.optimizer_ms


def step_parts(s: Schedule, costs: Sequence[StageCost], latency_ms: float,
               bandwidth_gbps: float, memory_bandwidth_gbps: float,
               dp: int, optimizer_fixed_ms: float = 0.0,
               job: Any = None) -> list[StepPart]:
    """Per rank, what follows its last backward: the data-parallel gradient all-reduce
    (a ring: 2(dp-1)/dp of the gradient bytes, 2(dp-1) latencies) and the optimizer step
    (a fixed time, measured by `ppsim profile` on CPU, plus ADAM_BYTES_PER_PARAM over
    memory bandwidth), as the executor records them. Parameters come from the cost
    model; a cost file without them costs nothing. A transformer's job
    (ppsim.job.model.Job) prices the step itself (ppsim.job.tail), the tied embedding's
    all-reduce with it."""
    params = [0] * s.pp
    for i, c in enumerate(costs):
        params[s.stage_rank(i)] += c.params
    if job is not None:
        tails = rank_tails(s, costs, job, memory_bandwidth_gbps, optimizer_fixed_ms)
        ends = end_ranks(s)
        return [StepPart(reduce_ms=t.reduce_ms, sync_ms=job.embedding_sync_ms(r, ends),
                         optimizer_ms=t.optimizer_ms) for r, t in enumerate(tails)]
    out = []
    for n in params:
        reduce = 0.0
        if dp > 1:
            reduce = 2 * (dp - 1) * latency_ms + wire_ms(bandwidth_gbps,
                                                         2 * (dp - 1) / dp * n * GRAD_BYTES)
        step = n * ADAM_BYTES_PER_PARAM / (memory_bandwidth_gbps * 1e6) \
            if memory_bandwidth_gbps > 0 else 0.0
        if n and (step or optimizer_fixed_ms):
            step += optimizer_fixed_ms
        out.append(StepPart(reduce_ms=reduce, optimizer_ms=step))
    return out


def sync_waits(ends: Sequence[float], parts: Sequence[StepPart]) -> list[float]:
    """Per rank, its idle time at the tied embedding's all-reduce: a collective, so the
    ranks that run it (those with a sync) start it together, at the later of their
    arrivals (last op's end, then the data-parallel reduce). 0 elsewhere."""
    pair = [r for r, p in enumerate(parts) if p.sync_ms > 0]
    waits = [0.0] * len(parts)
    if len(pair) < 2:
        return waits
    arrival = {r: ends[r] + parts[r].reduce_ms for r in pair}
    start = max(arrival.values())
    for r in pair:
        waits[r] = start - arrival[r]
    return waits


def end_ranks(s: Schedule) -> tuple[int, int]:
    """The ranks of the first stage (the embedding's) and the last (the head's)."""
    return s.stage_rank(0), s.stage_rank(s.num_stages - 1)


def rank_tails(s: Schedule, costs: Sequence[StageCost], job: Any,
               memory_bandwidth_gbps: float, optimizer_fixed_ms: float = 0.0) -> list[Any]:
    """Each rank's data-parallel step of a job (ppsim.job.tail.Tail): its stages'
    parameters, its one-microbatch forward and backward (the windows the gradient
    reduction and the parameter gather hide in), the embedding's and the head's ranks."""
    params, fwd, bwd, experts = [0] * s.pp, [0.0] * s.pp, [0.0] * s.pp, [0] * s.pp
    for i, c in enumerate(costs):
        params[s.stage_rank(i)] += c.params
        fwd[s.stage_rank(i)] += c.forward_ms
        bwd[s.stage_rank(i)] += c.backward_ms
        experts[s.stage_rank(i)] += c.expert_params
    ranks = [s.stage_rank(i) for i in range(len(costs))]
    first, last = end_ranks(s)
    return [job.tail(n, f, b, memory_bandwidth_gbps, optimizer_fixed_ms, r == first, e,
                     r == last, job.unbucketed(ranks, costs, r))
            for r, (n, f, b, e) in enumerate(zip(params, fwd, bwd, experts, strict=True))]


def summarize(static: Sequence[int], ends: list[float], busy: list[float], layers: list[int],
              memory_bytes: float, peaks: list[tuple[int, int]],
              parts: Sequence[StepPart] | None = None, boundary: float = 0.0) -> Summary:
    """Headline numbers from per-rank end times, busy times and memory peaks; `parts`
    (the step's tail, per rank, step_parts) runs after each rank's last op, the tied
    all-reduce's wait (sync_waits) lengthening the rank but not its busy time, and
    `boundary` (the executor's end-of-iteration loss all-reduce, measured) separates
    one iteration from the next: the iteration time is a whole iteration, start to
    the next start."""
    if parts is not None:
        tail = [p.busy_ms for p in parts]
        if any(tail):
            waits = sync_waits(ends, parts)
            ends = [e + t + w for e, t, w in zip(ends, tail, waits, strict=True)]
            busy = [b + t for b, t in zip(busy, tail, strict=True)]
    pp = len(ends)
    t = (max(ends) + boundary) if ends else 0.0
    ranks = []
    for r in range(pp):
        act, inflight = peaks[r]
        total = static[r] + act
        ranks.append(RankStats(rank=r, layers=layers[r], busy_ms=busy[r],
                               bubble_fraction=bubble_fraction(busy[r], t),
                               static_bytes=static[r], peak_activation_bytes=act,
                               peak_memory_bytes=total, peak_inflight=inflight,
                               fits=total <= memory_bytes))
    return Summary(iteration_time_ms=t, bubble_fraction=bubble_fraction(sum(busy), pp * t),
                   ranks=tuple(ranks))
