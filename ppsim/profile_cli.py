"""`ppsim profile` (measure a cost file) and `ppsim calibrate TRACE` (fit one to a real run).

Both write the same cost file format (ppsim.costfile) that `--costs FILE` or the
config's `costs_file = "..."` feed to simulate, plan and the TUI. Importing this
module is cheap: torch is imported inside `ppsim profile`'s handler only, and
calibration is pure logic (trace in, costs out).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from typing import Any

from ppsim.cli import add_config_flags, config_from_args, emit_json
from ppsim.config import Config, model_fields
from ppsim.costfile import cost_document, write_costs
from ppsim.costs import LayerCost, ModelCosts, stage_costs
from ppsim.errors import UserError
from ppsim.problem import Hardware, Problem, hardware, model_costs
from ppsim.schedules import Action, Schedule
from ppsim.trace import Trace, TraceOp, read_trace

PROFILE_HELP = "measure per-layer F/B/W time, bytes and P2P on this machine; write a cost file"
CALIBRATE_HELP = "fit the cost model to a real trace (per-kind scale, P2P delay); write a cost file"


def register(commands: dict[str, Any]) -> None:
    commands["profile"] = (PROFILE_HELP, _profile_args, cmd_profile)
    commands["calibrate"] = (CALIBRATE_HELP, _calibrate_args, cmd_calibrate)


def _profile_args(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, split_flags=False)
    g = p.add_argument_group("profile")
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    g.add_argument("--out", default="costs.json", metavar="FILE",
                   help="cost file to write (default ./costs.json)")
    g.add_argument("--repeats", type=int, default=20, metavar="N",
                   help="timed repeats per op after warm-up; the median is kept")
    g.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed repeats first")
    g.add_argument("--no-p2p", action="store_true",
                   help="skip the two-process P2P measurement (keep the config's values)")
    g.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help="a trace written by ppsim run")
    add_config_flags(p, split_flags=False)
    g = p.add_argument_group("calibrate")
    g.add_argument("--out", default="costs-calibrated.json", metavar="FILE",
                   help="cost file to write (default ./costs-calibrated.json)")
    g.add_argument("--estimator", choices=ESTIMATORS, default="mean",
                   help="how per-op ratios become one factor per kind (default: mean)")
    g.add_argument("--json", action="store_true", help="one JSON object on stdout")


# ------------------------------------------------------------------ profile


def _transformer_fields(cfg: Config, command: str) -> dict[str, Any]:
    fields = model_fields(cfg.model)
    if fields.get("kind") != "transformer":
        raise UserError("model.kind", f"ppsim {command} measures a transformer, not a uniform "
                        "cost model", "use a preset (e.g. --preset tiny-gpt) or kind = "
                        "\"transformer\"")
    if int(fields.get("tp", 1)) != 1:
        raise UserError("model.tp", f"the executor runs pipeline parallelism only, tp = "
                        f"{fields['tp']}", "set tp = 1 (--tp 1)")
    return fields


def cmd_profile(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    fields = _transformer_fields(cfg, "profile")
    if args.repeats < 1 or args.warmup < 0:
        raise UserError("--repeats", f"{args.repeats} repeats, {args.warmup} warm-up",
                        "need --repeats >= 1 and --warmup >= 0")
    import torch

    from executor.profile import profile

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device", "cuda requested but torch sees no GPU here",
                        "use --device cpu")
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    total = args.warmup + args.repeats + (0 if args.no_p2p else 1)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("building pieces", total=total)

        def progress(what: str, steps: int) -> None:
            bar.update(task, advance=steps, description=what)

        doc = profile(fields, args.device, args.repeats, args.warmup,
                      cfg.pipeline.microbatches, p2p=not args.no_p2p, progress=progress)
    write_costs(args.out, doc)
    if args.json:
        emit_json({"out": args.out, **doc})
        return 0
    _print_costs(doc, f"profiled on {doc['device']} (torch {doc['torch_version']}, "
                 f"{doc['threads']} thread(s)) in {doc['measurement']['seconds']:.1f} s")
    print(f"cost file written to {args.out} (use: ppsim simulate --costs {args.out})")
    return 0


def _print_costs(doc: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from ppsim.report import fmt_bytes

    c = Console()
    c.print(title)
    t = Table()
    for col in ("piece", "F ms", "B ms", "of which W ms", "static", "activations",
                "kept for W", "output"):
        t.add_column(col, justify="right")
    rows = [("embedding", doc["embedding"]), ("layer" if len(doc["layers"]) == 1
                                               else "layer 0", doc["layers"][0]),
            ("head + loss", doc["head"])]
    for name, x in rows:
        t.add_row(name, f"{x['forward_ms']:.3f}", f"{x['backward_ms']:.3f}",
                  f"{x['weight_grad_ms']:.3f}", fmt_bytes(x["static_bytes"]),
                  fmt_bytes(x["activation_bytes"]), fmt_bytes(x["weight_grad_bytes"]),
                  fmt_bytes(x["output_bytes"]))
    c.print(t)
    p2p = doc.get("p2p")
    if p2p:
        c.print(f"P2P: latency {p2p['latency_ms'] * 1e3:.1f} us, bandwidth "
                f"{p2p['bandwidth_gbps']:.2f} GB/s" + (f" ({p2p['backend']})"
                                                       if "backend" in p2p else ""))


# ------------------------------------------------------------------ calibrate


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


def steady_iterations(trace: Trace) -> list[int]:
    """Iterations after the run's warm-up (all of them if nothing else is left)."""
    its = trace.iterations
    warm = int(trace.info.get("warmup_iterations", 0) or 0)
    return [i for i in its if i >= warm] or its[-1:]


def _iteration_ops(trace: Trace, it: int) -> list[TraceOp]:
    return [op for op in trace.ops if op.iteration == it]


def measured_iteration_ms(trace: Trace, its: list[int]) -> float:
    """Mean compute span (first op start to last op end) of the given iterations: the
    simulator's iteration, which has no optimizer step (ppsim diff measures the same)."""
    spans = []
    for it in its:
        ops = _iteration_ops(trace, it)
        spans.append((max(o.end_us for o in ops) - min(o.start_us for o in ops)) / 1e3)
    return statistics.fmean(spans)


def schedule_from_trace(trace: Trace, it: int) -> Schedule:
    """The action lists the trace ran (one iteration's ops per rank, by start time), so
    calibration times exactly what was executed, whatever schedule produced it."""
    info = trace.info
    ops = _iteration_ops(trace, it)
    pp = int(info.get("pp", 1 + max(o.rank for o in ops)))
    vpp = int(info.get("vpp", 1))
    m = int(info.get("microbatches", 1 + max(o.microbatch for o in ops)))
    per_rank: list[list[TraceOp]] = [[] for _ in range(pp)]
    for o in ops:
        if not 0 <= o.rank < pp:
            raise UserError("trace", f"{trace.path}: rank {o.rank} outside pp = {pp}",
                            "pass a complete trace from ppsim run")
        per_rank[o.rank].append(o)
    actions = tuple(tuple(Action(o.kind, o.stage, o.microbatch)
                          for o in sorted(r, key=lambda o: o.start_us)) for r in per_rank)
    sched = Schedule(str(info.get("schedule", "trace")), pp, vpp, m,
                     str(info.get("placement", "loop")), any(o.kind == "W" for o in ops),
                     actions)
    from ppsim.schedules import validate

    try:
        validate(sched)
    except UserError as exc:
        raise UserError("trace", f"{trace.path}: iteration {it} is not a complete schedule "
                        f"({exc})", "pass a complete trace from ppsim run") from None
    return sched


def _predicted_ms(costs: ModelCosts, problem: Problem) -> dict[tuple[str, int], float]:
    sc = stage_costs(costs, problem.split)
    split_bw = problem.schedule.split_backward
    out = {}
    for s, c in enumerate(sc):
        out[("F", s)] = c.forward_ms
        out[("B", s)] = c.backward_ms - c.weight_grad_ms if split_bw else c.backward_ms
        out[("W", s)] = c.weight_grad_ms
    return out


def _scale(c: LayerCost, kf: float, kb: float, kw: float) -> LayerCost:
    w = c.weight_grad_ms * kw
    return replace(c, forward_ms=c.forward_ms * kf,
                   backward_ms=(c.backward_ms - c.weight_grad_ms) * kb + w, weight_grad_ms=w)


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


def op_timings(trace: Trace, its: list[int], schedule: Schedule) -> tuple[list[OpTiming],
                                                                          list[float]]:
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
    chains = []  # (op, previous op on its rank, remote source)
    for it in its:
        ops = _iteration_ops(trace, it)
        by_key = {(o.kind, o.stage, o.microbatch): o for o in ops}
        for r in range(schedule.pp):
            prev: TraceOp | None = None
            for o in sorted((o for o in ops if o.rank == r), key=lambda o: o.start_us):
                chains.append((o, prev, _remote_source(o, by_key, n)))
                prev = o
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
    head_pred = {"F": base.head.forward_ms,
                 "B": base.head.backward_ms - (base.head.weight_grad_ms if split_bw else 0.0),
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


def calibrate(trace: Trace, cfg: Config, how: str = "mean") -> Calibration:
    """Fit per-kind scale factors (and the P2P delay) of cfg's cost model to a trace."""
    from ppsim.simulator import simulate
    from ppsim.split import split_from_counts

    if how not in ESTIMATORS:
        raise UserError("--estimator", f"unknown estimator {how!r}",
                        "use one of " + ", ".join(ESTIMATORS))
    its = steady_iterations(trace)
    info = trace.info
    if not isinstance(info.get("split"), list):
        raise UserError("trace", f"{trace.path} records no split (otherData.split)",
                        "pass a trace written by ppsim run or ppsim simulate --trace")
    base = model_costs(cfg)
    schedule = schedule_from_trace(trace, its[-1])
    try:
        split = split_from_counts([int(x) for x in info["split"]], schedule.pp, schedule.vpp,
                                  base.num_layers, schedule.placement)  # type: ignore[arg-type]
    except (UserError, TypeError, ValueError) as exc:
        raise UserError("--config", f"the trace's split {info['split']} does not fit the "
                        f"configured model ({getattr(exc, 'problem', exc)})",
                        "pass the --config (or --preset) the trace was recorded with") from None
    hw = hardware(cfg)
    before = Problem(base, split, schedule, hw)
    predicted = _predicted_ms(base, before)
    timings, delays = op_timings(trace, its, schedule)
    factors, head = fit_factors(timings, predicted, base, schedule, how)
    # Without W ops the weight-grad share is part of B and moves with it.
    kf, kb = factors["F"] or 1.0, factors["B"] or 1.0
    kw = factors["W"] if factors["W"] is not None else kb
    hf, hb = head["F"] or kf, head["B"] or kb
    hw_ = head["W"] if head["W"] is not None else (kw if factors["W"] is not None else hb)
    costs = ModelCosts(layers=tuple(_scale(c, kf, kb, kw) for c in base.layers),
                       embedding=_scale(base.embedding, kf, kb, kw),
                       head=_scale(base.head, hf, hb, hw_))
    delay = statistics.median(delays) if delays else None
    new_hw = hw
    if delay is not None:
        # One message size only, so only the total delay is known: keep the bandwidth
        # and let latency take the rest, or if the bytes alone already take longer than
        # the delay seen, drop the latency and raise the bandwidth to match it.
        nbytes = costs.hidden_bytes
        bw_ms = hw.transfer_ms(nbytes) - hw.p2p_latency_ms
        if delay >= bw_ms:
            new_hw = replace(hw, p2p_latency_ms=delay - bw_ms)
        else:
            new_hw = replace(hw, p2p_latency_ms=0.0,
                             p2p_bandwidth_gbps=nbytes / delay / 1e6 if delay > 0 else 0.0)
    after = Problem(costs, split, schedule, new_hw)
    opt = _optimizer_ms(trace, its)
    return Calibration(
        costs=costs, hardware=new_hw, factors=factors, head_factors=head,
        samples={k: sum(t.op.kind == k for t in timings) for k in "FBW"}, p2p_delay_ms=delay,
        p2p_samples=len(delays), measured_ms=measured_iteration_ms(trace, its),
        before_ms=simulate(before).summary.iteration_time_ms,
        after_ms=simulate(after).summary.iteration_time_ms, iterations=its,
        optimizer_ms=statistics.fmean(opt) if opt else None, estimator=how)


def _optimizer_ms(trace: Trace, its: list[int]) -> list[float]:
    """Optimizer step times (the simulator does not model them; reported for context)."""
    import json

    try:
        with open(trace.path, encoding="utf-8") as fh:
            events = json.load(fh).get("traceEvents", [])
    except (OSError, ValueError, AttributeError):
        return []
    per: dict[int, float] = {}
    for ev in events:
        if isinstance(ev, dict) and ev.get("cat") == "optimizer" and ev.get("ph") == "X":
            it = int(ev.get("args", {}).get("iteration", -1))
            if it in its:
                per[it] = max(per.get(it, 0.0), float(ev.get("dur", 0.0)) / 1e3)
    return list(per.values())


def cmd_calibrate(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    trace = read_trace(args.trace)
    cal = calibrate(trace, cfg, args.estimator)
    fields = model_fields(cfg.model)
    err_before = (cal.before_ms - cal.measured_ms) / cal.measured_ms
    err_after = (cal.after_ms - cal.measured_ms) / cal.measured_ms
    summary = {
        "trace": args.trace, "iterations": cal.iterations, "base": cfg.costs_file or "analytic",
        "estimator": cal.estimator, "factors": cal.factors, "head_factors": cal.head_factors,
        "samples": cal.samples,
        "p2p_delay_ms": cal.p2p_delay_ms,
        "p2p_samples": cal.p2p_samples, "measured_iteration_ms": cal.measured_ms,
        "predicted_before_ms": cal.before_ms, "predicted_after_ms": cal.after_ms,
        "error_before": err_before, "error_after": err_after,
        "optimizer_step_ms": cal.optimizer_ms,
    }
    doc = cost_document(
        cal.costs, source="calibrate",
        model=fields if fields.get("kind") == "transformer" else None,
        p2p={"latency_ms": cal.hardware.p2p_latency_ms,
             "bandwidth_gbps": cal.hardware.p2p_bandwidth_gbps,
             "from": "trace" if cal.p2p_delay_ms is not None else "base"},
        device=trace.info.get("device"), calibration=summary)
    write_costs(args.out, doc)
    if args.json:
        emit_json({"out": args.out, **summary})
        return 0
    from rich.console import Console

    c = Console()
    f = cal.factors
    c.print(f"calibrated on {args.trace}, iteration(s) {cal.iterations} (base: "
            f"{summary['base']})")
    c.print(f"scale factors ({cal.estimator} of measured / predicted): " + "  ".join(
        f"{k} {v:.3f} ({cal.samples[k]} ops)" if v is not None else f"{k} n/a"
        for k, v in f.items()))
    if cal.head_factors != cal.factors:
        c.print("head (norm + LM head + loss) factors: " + "  ".join(
            f"{k} {v:.3f}" for k, v in cal.head_factors.items() if v is not None))
    if cal.p2p_delay_ms is not None:
        c.print(f"P2P delay {cal.p2p_delay_ms * 1e3:.1f} us (median of {cal.p2p_samples} "
                f"waits) -> latency {cal.hardware.p2p_latency_ms * 1e3:.1f} us, bandwidth "
                f"{cal.hardware.p2p_bandwidth_gbps:.2f} GB/s")
    else:
        c.print("P2P: no transfer with a waiting receiver; kept the base latency")
    c.print(f"iteration time: measured {cal.measured_ms:.2f} ms (steady-state mean, compute "
            f"span)   predicted before {cal.before_ms:.2f} ms ({err_before:+.1%})   after "
            f"[bold]{cal.after_ms:.2f} ms ({err_after:+.1%})[/bold]")
    if cal.optimizer_ms is not None:
        c.print(f"(optimizer step {cal.optimizer_ms:.2f} ms per iteration, not simulated)")
    c.print(f"cost file written to {args.out} (use: ppsim simulate --costs {args.out})")
    sys.stdout.flush()
    return 0
