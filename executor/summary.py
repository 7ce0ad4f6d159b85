"""Summary of a recorded run, computed from the merged trace events.

Warm-up iterations are excluded: an iteration's time is the span from its
first op (on any rank) to the end of its last op, the gradient all-reduce (R)
and optimizer step (S) included, so it is a whole training step; a rank's
bubble is the part of that span it did not spend computing F, B or W. With
data parallelism the trace holds replica 0 (every replica runs the same order).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ppsim.executor.builders import ModelBuilder
from ppsim.pipeline.problem import Problem
from ppsim.sim.summary import bubble_fraction
from ppsim.trace.diff import consecutive_wholes, listed_wholes, median_gap_ms, whole_ms

PIPELINE_KINDS = ("F", "B", "W")


def _tokens(problem: Problem, builder: ModelBuilder, dp: int) -> int:
    shape = builder.activation_shape
    per_mb = shape[0] * shape[1] if len(shape) >= 2 else shape[0]
    return problem.schedule.microbatches * per_mb * dp


def iteration_spans(events: list[dict]) -> dict[int, tuple[float, float]]:
    """(first start, last end) in us of each iteration's compute and optimizer events."""
    span: dict[int, tuple[float, float]] = {}
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in ("compute", "optimizer"):
            it = int(ev["args"]["iteration"])
            lo, hi = span.get(it, (float("inf"), float("-inf")))
            span[it] = (min(lo, ev["ts"]), max(hi, ev["ts"] + ev["dur"]))
    return span


def alternated_wholes(a: dict[int, tuple[float, float]], b: dict[int, tuple[float, float]]
                      ) -> tuple[list[float | None], list[float | None]]:
    """Whole iteration lengths (ms) of two runs that alternated in the same processes
    (a's iteration i, then b's i, then a's i + 1): each lasts until the other starts.
    Spans on one clock; None where nothing followed (b's last iteration)."""
    n = max([*a, *b], default=-1) + 1
    wa = [(b[i][0] - a[i][0]) / 1e3 if i in a and i in b else None for i in range(n)]
    wb = [(a[i + 1][0] - b[i][0]) / 1e3 if i in b and i + 1 in a else None for i in range(n)]
    return wa, wb


def summarize(events: list[dict], problem: Problem, builder: ModelBuilder, iterations: int,
              warmup: int, losses: list[float], peaks: list[int], dp: int = 1,
              whole: list[float | None] | None = None) -> dict[str, Any]:
    """The run's summary; `whole`: each iteration's whole length in ms when the run
    alternated with another (else start to the next start)."""
    pp = problem.split.pp
    recorded = [i for i in range(iterations) if i >= warmup]
    busy: dict[tuple[int, int], float] = defaultdict(float)
    step: dict[tuple[str, int], float] = defaultdict(float)
    mem_peak = [0] * pp
    for ev in events:
        if ev.get("ph") == "C" and ev.get("cat") == "memory":
            if ev["args"] and ev["pid"] < pp:
                mem_peak[ev["pid"]] = max(mem_peak[ev["pid"]], int(sum(ev["args"].values())))
            continue
        if ev.get("ph") != "X" or ev.get("cat") not in ("compute", "optimizer"):
            continue
        it = int(ev["args"]["iteration"])
        kind = ev["args"].get("kind")
        if ev["cat"] == "compute" and kind in PIPELINE_KINDS:
            busy[(ev["pid"], it)] += ev["dur"]
        elif kind in ("R", "S") and it in recorded:
            step[(kind, ev["pid"])] += ev["dur"]
    # Whole iterations, as ppsim.diff compares them: start to the next start (the
    # last one: its span plus the median gap between iterations).
    span = iteration_spans(events)
    given = consecutive_wholes(span) if whole is None else listed_wholes(whole, span)
    gap = median_gap_ms(span, given)
    spans = [whole_ms(span, i, gap, given) * 1e3 for i in recorded if i in span]
    iter_us = sum(spans) / len(spans) if spans else 0.0
    ranks = []
    for r in range(pp):
        b = [busy[(r, i)] for i in recorded]
        busy_us = sum(b) / len(b) if b else 0.0
        ranks.append({"rank": r, "layers": problem.split.rank_layers(r),
                      "busy_ms": busy_us / 1e3,
                      "bubble_fraction": bubble_fraction(busy_us, iter_us),
                      "peak_memory_bytes": max(mem_peak[r], peaks[r] if r < len(peaks) else 0)})
        for kind, name in (("R", "grad_reduce_ms"), ("S", "optimizer_ms")):
            ranks[-1][name] = step[(kind, r)] / max(1, len(recorded)) / 1e3
    total_busy = sum(x["busy_ms"] for x in ranks)
    return {
        "engine": "ppsim",
        "schedule": problem.schedule.name, "pp": pp, "vpp": problem.split.vpp, "dp": dp,
        "microbatches": problem.schedule.microbatches, "split": list(problem.split.counts),
        "iterations": iterations, "warmup_iterations": warmup,
        "iteration_time_ms": iter_us / 1e3,
        "iteration_times_ms": [s / 1e3 for s in spans],
        "tokens_per_s": _tokens(problem, builder, dp) / (iter_us / 1e6) if iter_us else 0.0,
        "bubble_fraction": bubble_fraction(total_busy, pp * iter_us / 1e3),
        "peak_memory_bytes": max(x["peak_memory_bytes"] for x in ranks),
        "loss": losses[-1] if losses else None, "losses": losses, "ranks": ranks,
    }


def peer_summary(problem: Problem, builder: ModelBuilder, iterations: int, warmup: int,
                 times_ms: list[float], losses: list[float]) -> dict[str, Any]:
    """The torch.distributed.pipelining peer: whole-iteration times only."""
    rec = times_ms[warmup:] or times_ms
    t = sum(rec) / len(rec) if rec else 0.0
    return {"engine": "torch", "schedule": problem.schedule.name, "pp": problem.split.pp,
            "vpp": problem.split.vpp, "microbatches": problem.schedule.microbatches,
            "split": list(problem.split.counts), "iterations": iterations,
            "warmup_iterations": warmup, "iteration_time_ms": t,
            "iteration_times_ms": rec,
            "tokens_per_s": _tokens(problem, builder, 1) / (t / 1e3) if t else 0.0,
            "loss": losses[-1] if losses else None, "losses": losses}
