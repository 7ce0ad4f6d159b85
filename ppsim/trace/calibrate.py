"""Fit the cost model to a real trace: per-kind scale factors and the P2P delay.

Pure logic: a trace and a config in, calibrated costs out (`ppsim calibrate`
writes them as a cost file). The per-rank action lists are rebuilt from the
trace itself, so any schedule works.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from ppsim.config.schema import Config
from ppsim.costs.model import LayerCost, ModelCosts, input_grad_ms, stage_costs
from ppsim.errors import UserError
from ppsim.job.throughput import job_info
from ppsim.pipeline.messages import wire_ms
from ppsim.pipeline.problem import Hardware, Problem, hardware, model_costs, run_topology
from ppsim.pipeline.split import split_from_counts
from ppsim.schedules.generators import Action, Schedule, validate
from ppsim.sim.simulate import simulate
from ppsim.trace.read import Trace, TraceOp


@dataclass(frozen=True)
class Calibration:
    costs: ModelCosts
    hardware: Hardware
    factors: dict[str, float | None]
    """Per kind: typical measured / predicted duration (None: no such ops)."""
    head_factors: dict[str, float | None]
    """Per kind, the head's own factor where the trace tells it apart (else as factors)."""
    samples: dict[str, int]
    p2p_delay_ms: float | None
    """Median send-to-start gap where the receiver sat waiting (None: none seen)."""
    p2p_samples: int
    measured_ms: float
    before_ms: float
    after_ms: float
    iterations: list[int]
    optimizer_ms: float | None
    estimator: str
    warmup_fitted: list[int]
    """Of `iterations`, those that are warm-up (`warmup_fitted_iterations`)."""


def steady_iterations(trace: Trace) -> list[int]:
    """Iterations after the run's warm-up (the last one where warm-up is all there is)."""
    its = trace.iterations
    warm = trace.info.get("warmup_iterations") or 0  # an int: checked by read_trace
    return [i for i in its if i >= warm] or its[-1:]


def warmup_fitted_iterations(trace: Trace, its: list[int]) -> list[int]:
    """Of the iterations fitted, those a run spent warming up: the run's first (allocator
    growth, first kernels), even where it recorded no warm-up, and any before its
    `warmup_iterations`. A simulated trace has none."""
    if trace.info.get("source") == "simulator":
        return []
    warm = trace.info.get("warmup_iterations") or 0
    return [i for i in its if i == 0 or i < warm]


def by_iteration(trace: Trace) -> dict[int, list[TraceOp]]:
    """The trace's ops grouped by iteration, in one pass (each iteration is looked up,
    never found by scanning every op: that made calibrate quadratic in iterations)."""
    out: dict[int, list[TraceOp]] = {}
    for op in trace.ops:
        out.setdefault(op.iteration, []).append(op)
    return out


def measured_iteration_ms(trace: Trace, its: list[int],
                          grouped: dict[int, list[TraceOp]] | None = None) -> float:
    """Mean compute span (first op start to last op end) of the given iterations: the
    simulator's iteration, which has no optimizer step (ppsim diff measures the same)."""
    grouped = by_iteration(trace) if grouped is None else grouped
    spans = []
    for it in its:
        ops = grouped[it]
        spans.append((max(o.end_us for o in ops) - min(o.start_us for o in ops)) / 1e3)
    return statistics.fmean(spans)


def schedule_from_trace(trace: Trace, it: int,
                        grouped: dict[int, list[TraceOp]] | None = None) -> Schedule:
    """The action lists the trace ran (one iteration's ops per rank, by start time), so
    calibration times exactly what was executed, whatever schedule produced it."""
    info = trace.info
    ops = (by_iteration(trace) if grouped is None else grouped)[it]
    pp = int(info.get("pp", 1 + max(o.rank for o in ops)))
    vpp = int(info.get("vpp", 1))
    m = int(info.get("microbatches", 1 + max(o.microbatch for o in ops)))
    per_rank: list[list[TraceOp]] = [[] for _ in range(pp)]
    for o in ops:
        if not 0 <= o.rank < pp:
            raise UserError("trace", f"{trace.path}: rank {o.rank} outside pp = {pp}",
                            "pass a complete trace from ppsim run")
        per_rank[o.rank].append(o)
    split_bw = any(o.kind == "W" for o in ops)
    want = pp * vpp * m * (3 if split_bw else 2)
    if len(ops) != want:  # checked first: validate() walks every stage x microbatch
        raise UserError("trace", f"{trace.path}: iteration {it} has {len(ops):,} ops where pp "
                        f"{pp} x vpp {vpp} x {m:,} microbatches needs {want:,}",
                        "pass a complete trace from ppsim run")
    actions = tuple(tuple(Action(o.kind, o.stage, o.microbatch)
                          for o in sorted(r, key=lambda o: o.start_us)) for r in per_rank)
    sched = Schedule(str(info.get("schedule", "trace")), pp, vpp, m,
                     str(info.get("placement", "loop")), split_bw, actions)

    try:
        validate(sched)
    except UserError as exc:
        raise UserError("trace", f"{trace.path}: iteration {it} is not a complete schedule "
                        f"({exc})", "pass a complete trace from ppsim run") from None
    return sched


KEPT_CONDITIONS = ("devices", "processes", "iteration_boundary_ms", "optimizer")
"""Of a base cost file's `conditions`, what the calibrated file keeps: the measured
iteration boundary and optimizer step, which its fitted time includes, and the placement
it was profiled for. The fit prices no shared cores or per-message CPU (the trace's op
times and gaps hold them, so the factors do) and replaces the latency by the one the trace
shows: kept, those would be counted twice."""


def kept_conditions(raw: object) -> dict[str, object] | None:
    """The part of a base file's `conditions` a calibrated file keeps (None: none)."""
    if not isinstance(raw, dict):
        return None
    return {k: raw[k] for k in KEPT_CONDITIONS if k in raw} or None


def _predicted_ms(costs: ModelCosts, problem: Problem) -> dict[tuple[str, int], float]:
    sc = stage_costs(costs, problem.split)
    split_bw = problem.schedule.split_backward
    out = {}
    for s, c in enumerate(sc):
        out[("F", s)] = c.forward_ms
        out[("B", s)] = c.input_grad_ms(split_bw)
        out[("W", s)] = c.weight_grad_ms
    return out


def _scale(c: LayerCost, kf: float, kb: float, kw: float) -> LayerCost:
    """F by kf; the input-gradient part of each backward path by kb, its W part by kw.

    The split path (split_backward_ms, when measured) is scaled as its two parts too, so
    W never outgrows the backward it belongs to."""
    w = c.weight_grad_ms * kw
    split = (c.split_backward_ms - c.weight_grad_ms) * kb + w if c.split_backward_ms else 0.0
    return replace(c, forward_ms=c.forward_ms * kf,
                   backward_ms=(c.backward_ms - c.weight_grad_ms) * kb + w, weight_grad_ms=w,
                   split_backward_ms=split)


ESTIMATORS = ("mean", "trimmed", "median")


def estimate(values: list[float], how: str = "mean") -> float:
    """Typical value of per-op measured / predicted ratios.

    "mean" (default): an iteration's time is a sum of op durations, so the mean is
    what it follows; op times on a shared CPU are skewed right (preemption, a
    neighbour's burst), and on recorded runs the median fitted iteration times
    10-25 % short where the mean stayed within a few %. "trimmed" drops the top
    and bottom 10 % first; "median" ignores the tail entirely.
    """
    xs = sorted(values)
    if how == "median":
        return statistics.median(xs)
    if how == "trimmed":
        cut = len(xs) // 10
        xs = xs[cut:len(xs) - cut] or xs
    return statistics.fmean(xs)


@dataclass(frozen=True)
class OpTiming:
    op: TraceOp
    effective_ms: float
    """Duration plus the dispatch gap before it (time the rank was busy but not in an op)."""


def _remote_source(o: TraceOp, by_key: dict[tuple[str, int, int], TraceOp],
                   n: int) -> TraceOp | None:
    """The op on another rank whose message o consumes (None: local or none)."""
    src = None
    if o.kind == "F" and o.stage > 0:
        src = by_key.get(("F", o.stage - 1, o.microbatch))
    elif o.kind == "B" and o.stage < n - 1:
        src = by_key.get(("B", o.stage + 1, o.microbatch))
    return src if src is not None and src.rank != o.rank else None


def op_timings(trace: Trace, its: list[int], schedule: Schedule,
               grouped: dict[int, list[TraceOp]] | None = None
               ) -> tuple[list[OpTiming], list[float]]:
    """Effective op durations, and the P2P delays seen, over the given iterations.

    The simulator starts an op the moment its rank is free and its input has
    arrived; a real rank also spends time between ops (receive bookkeeping,
    Python). That gap belongs to the op that follows, except the part a message
    explains. Where a rank sat waiting for a message (the sender finished after
    the rank's previous op), the time from the sender's op end to this op's
    start is a delivery delay sample; their median d then explains up to
    `sender end + d - previous end` of the other gaps before remote inputs.
    """
    n = schedule.num_stages
    grouped = by_iteration(trace) if grouped is None else grouped
    chains = []  # (op, previous op on its rank, remote source)
    for it in its:
        ops = grouped[it]
        by_key = {(o.kind, o.stage, o.microbatch): o for o in ops}
        prev: dict[int, TraceOp] = {}
        for o in sorted(ops, key=lambda o: (o.rank, o.start_us)):
            chains.append((o, prev.get(o.rank), _remote_source(o, by_key, n)))
            prev[o.rank] = o
    delays = [max(0.0, (o.start_us - src.end_us) / 1e3) for o, prev, src in chains
              if src is not None and (prev is None or src.end_us > prev.end_us)]
    d_us = statistics.median(delays) * 1e3 if delays else 0.0
    timings = []
    for o, prev, src in chains:
        gap = 0.0
        if prev is not None and (src is None or src.end_us <= prev.end_us):
            gap = max(0.0, o.start_us - prev.end_us)
            if src is not None:  # the message may still have been in flight
                gap = max(0.0, gap - max(0.0, src.end_us + d_us - prev.end_us))
        timings.append(OpTiming(o, (o.dur_us + gap) / 1e3))
    return timings, delays


def fit_factors(timings: list[OpTiming], predicted: dict[tuple[str, int], float],
                base: ModelCosts, schedule: Schedule, how: str
                ) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Per-kind scale factors for the layers (and embedding), and for the head.

    The head (final norm, vocabulary projection, loss) is what makes uneven splits
    pay off, and the analytic model misjudges it differently from a decoder layer,
    so where the trace allows it gets its own factor: the layers' factor comes from
    the stages without the head, and the head's from what the last stage took
    beyond its layers. Otherwise (one stage, or a negative remainder) every piece
    shares the factor fitted over all ops.
    """
    last = schedule.num_stages - 1
    split_bw = schedule.split_backward
    # The head's B as the stage's is predicted: the split path where the schedule splits.
    head_pred = {"F": base.head.forward_ms, "B": input_grad_ms(base.head, split_bw),
                 "W": base.head.weight_grad_ms}
    body: dict[str, float | None] = {}
    head: dict[str, float | None] = {}
    for k in "FBW":
        mine = [t for t in timings if t.op.kind == k and predicted.get((k, t.op.stage), 0) > 0]
        ratios = [t.effective_ms / predicted[(k, t.op.stage)] for t in mine]
        overall = estimate(ratios, how) if ratios else None
        rest = [t.effective_ms / predicted[(k, t.op.stage)] for t in mine if t.op.stage != last]
        tail = [t.effective_ms for t in mine if t.op.stage == last]
        body[k], head[k] = overall, overall
        if rest and tail and head_pred[k] > 0:
            a = estimate(rest, how)
            h = (estimate(tail, how) - a * (predicted[(k, last)] - head_pred[k])) / head_pred[k]
            if h > 0:
                body[k], head[k] = a, h
    return body, head


def _link_from_delay(hw: Hardware, delay: float, nbytes: float) -> Hardware:
    """`hw` with the P2P link that delivers a message of `nbytes` in `delay` ms. One
    message size only, so only the total delay is known: keep the bandwidth and let
    latency take the rest, or if the bytes alone already take longer than the delay seen,
    drop the latency and raise the bandwidth to match it."""
    bw_ms = wire_ms(hw.p2p_bandwidth_gbps, nbytes)
    if delay >= bw_ms:
        return replace(hw, p2p_latency_ms=delay - bw_ms)
    return replace(hw, p2p_latency_ms=0.0,
                   p2p_bandwidth_gbps=nbytes / delay / 1e6 if delay > 0 else 0.0)


def _check_same_job(trace: Trace, job: Any, pp: int) -> None:
    """Refuse a config whose model is not the one the trace recorded (its FLOPs a token;
    a run's replicas make no difference to it): the fitted factors would scale one
    model's costs to another's times."""
    recorded = trace.info.get("job")
    if not isinstance(recorded, dict) or job is None:
        return
    mine = job_info(job)
    assert mine is not None
    flops, tokens = recorded.get("flops"), recorded.get("tokens")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0
               for v in (flops, tokens)):
        return  # the trace's own check (ppsim.job.throughput.from_info) names it
    theirs, ours = flops / tokens, mine["flops"] / mine["tokens"]  # type: ignore[operator]
    if not math.isclose(theirs, ours, rel_tol=1e-6):
        raise UserError("--config", f"{trace.path} was recorded for another model: "
                        f"{theirs:,.4g} FLOPs a token there, {ours:,.4g} in the configured "
                        "one", "pass the --config (or --preset) the trace was recorded with")
    _check_same_replica(trace, recorded.get("gpus"), job, pp)


def _check_same_replica(trace: Trace, gpus: object, job: Any, pp: int) -> None:
    """Refuse a config whose replica (tp x cp x pp GPUs) is not the run's: at another tp
    each rank's share of a layer differs, and the factors would fold the ratio in."""
    dp, cp = trace.info.get("dp"), trace.info.get("cp", 1)  # runs without cp record none
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in (gpus, dp, cp)) or gpus % dp:  # type: ignore[operator]
        return  # a simulated trace records no dp; a run's sizes are checked where read
    theirs = gpus // dp // cp // pp  # type: ignore[operator]
    s = job.shape.sizes
    if theirs != s.tp or cp != s.cp:
        raise UserError("--tp", f"{trace.path} was recorded at tp {theirs}, cp {cp}; the "
                        f"configured job is tp {s.tp}, cp {s.cp}", "pass the --tp and --cp "
                        "the trace was recorded with")


def calibrate(trace: Trace, cfg: Config, how: str = "mean") -> Calibration:
    """Fit per-kind scale factors (and the P2P delay) of cfg's cost model to a trace."""

    if how not in ESTIMATORS:
        raise UserError("--estimator", f"unknown estimator {how!r}",
                        "use one of " + ", ".join(ESTIMATORS))
    its = steady_iterations(trace)
    grouped = by_iteration(trace)
    if measured_iteration_ms(trace, its, grouped) <= 0:
        raise UserError("trace", f"{trace.path}: every op of iteration(s) {its} takes 0 ms, "
                        "so there is nothing to fit", "pass a trace of a real run")
    info = trace.info
    if not isinstance(info.get("split"), list):
        raise UserError("trace", f"{trace.path} records no split (otherData.split)",
                        "pass a trace written by ppsim run or ppsim simulate --trace")
    base = model_costs(cfg)
    # Every iteration fitted is checked whole: a missing op's time would fall into the
    # gap before the next op on its rank and inflate that op's factor.
    for it in its[:-1]:
        schedule_from_trace(trace, it, grouped)
    schedule = schedule_from_trace(trace, its[-1], grouped)
    try:
        split = split_from_counts([int(x) for x in info["split"]], schedule.pp, schedule.vpp,
                                  base.num_layers, schedule.placement,  # type: ignore[arg-type]
                                  base.mtp_layers)
    except (UserError, TypeError, ValueError) as exc:
        raise UserError("--config", f"the trace's split {info['split']} does not fit the "
                        f"configured model ({getattr(exc, 'problem', exc)})",
                        "pass the --config (or --preset) the trace was recorded with") from None
    hw = hardware(cfg)
    _check_same_job(trace, hw.job, schedule.pp)
    # 'before' is what simulate --costs BASE gives, the base file's shared cores and
    # per-message CPU included; 'after' prices none (KEPT_CONDITIONS).
    before = Problem(base, split, schedule, hw, run_topology(cfg, hw))
    predicted = _predicted_ms(base, before)
    timings, delays = op_timings(trace, its, schedule, grouped)
    factors, head = fit_factors(timings, predicted, base, schedule, how)
    # Without W ops the weight-grad share is part of B and moves with it.
    kf, kb = factors["F"] or 1.0, factors["B"] or 1.0
    kw = factors["W"] if factors["W"] is not None else kb
    hf, hb = head["F"] or kf, head["B"] or kb
    hw_ = head["W"] if head["W"] is not None else (kw if factors["W"] is not None else hb)
    costs = ModelCosts(layers=tuple(_scale(c, kf, kb, kw) for c in base.layers),
                       embedding=_scale(base.embedding, kf, kb, kw),
                       head=_scale(base.head, hf, hb, hw_), kinds=base.kinds,
                       mtp_layers=base.mtp_layers, tied=base.tied,
                       mtp_embedding=base.mtp_embedding)
    delay = statistics.median(delays) if delays else None
    new_hw = hw if delay is None else _link_from_delay(hw, delay, costs.hidden_bytes)
    after = Problem(costs, split, schedule, new_hw)
    opt = [trace.optimizer_ms[it] for it in its if it in trace.optimizer_ms]
    return Calibration(
        costs=costs, hardware=new_hw, factors=factors, head_factors=head,
        samples={k: sum(t.op.kind == k for t in timings) for k in "FBW"}, p2p_delay_ms=delay,
        p2p_samples=len(delays), measured_ms=measured_iteration_ms(trace, its, grouped),
        before_ms=simulate(before).summary.iteration_time_ms,
        after_ms=simulate(after).summary.iteration_time_ms, iterations=its,
        optimizer_ms=statistics.fmean(opt) if opt else None, estimator=how,
        warmup_fitted=warmup_fitted_iterations(trace, its))
