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

from executor.builders import ModelBuilder
from ppsim.diff import median_gap_ms, whole_ms
from ppsim.problem import Problem

PIPELINE_KINDS = ("F", "B", "W")


def _tokens(problem: Problem, builder: ModelBuilder, dp: int) -> int:
    shape = builder.activation_shape
    per_mb = shape[0] * shape[1] if len(shape) >= 2 else shape[0]
    return problem.schedule.microbatches * per_mb * dp


def summarize(events: list[dict], problem: Problem, builder: ModelBuilder, iterations: int,
              warmup: int, losses: list[float], peaks: list[int], dp: int = 1
              ) -> dict[str, Any]:
    pp = problem.split.pp
    recorded = [i for i in range(iterations) if i >= warmup]
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
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
        lo[it] = min(lo.get(it, ev["ts"]), ev["ts"])
        hi[it] = max(hi.get(it, 0.0), ev["ts"] + ev["dur"])
        kind = ev["args"].get("kind")
        if ev["cat"] == "compute" and kind in PIPELINE_KINDS:
            busy[(ev["pid"], it)] += ev["dur"]
        elif kind in ("R", "S") and it in recorded:
            step[(kind, ev["pid"])] += ev["dur"]
    # Whole iterations, as ppsim.diff compares them: start to the next start (the
    # last one: its span plus the median gap between iterations).
    span = {i: (lo[i], hi[i]) for i in lo}
    gap = median_gap_ms(span)
    spans = [whole_ms(span, i, gap) * 1e3 for i in recorded if i in lo]
    iter_us = sum(spans) / len(spans) if spans else 0.0
    ranks = []
    for r in range(pp):
        b = [busy[(r, i)] for i in recorded]
        busy_us = sum(b) / len(b) if b else 0.0
        ranks.append({"rank": r, "layers": problem.split.rank_layers(r),
                      "busy_ms": busy_us / 1e3,
                      "bubble_fraction": 1 - busy_us / iter_us if iter_us else 0.0,
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
        "bubble_fraction": 1 - total_busy / (pp * iter_us / 1e3) if iter_us else 0.0,
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
