"""Simulated-vs-real summary for the TUI.

`compare` uses `ppsim.diff` (the `ppsim diff` engine) when the two pipelines
have the same shape, and falls back to a small summary of its own (iteration
times and matched ops) when they don't, or when ppsim.diff is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Comparison:
    trace_path: str
    sim_ms: float
    real_ms: float
    """Mean iteration time over the trace's iterations."""
    iterations: int
    matched: int
    """Ops (rank, chunk, microbatch, kind) present in both."""
    sim_only: int
    real_only: int
    shape_note: str
    """Empty when the trace was run with the simulated schedule and split."""
    details: tuple[str, ...] = ()
    """Extra lines from ppsim diff (duration errors, critical path, worst op)."""

    @property
    def rel_error(self) -> float:
        """(simulated - real) / real."""
        return (self.sim_ms - self.real_ms) / self.real_ms if self.real_ms > 0 else 0.0

    def lines(self) -> list[str]:
        out = [f"trace {self.trace_path}: {self.iterations} iteration(s)",
               f"real {self.real_ms:.3f} ms   simulated {self.sim_ms:.3f} ms   "
               f"error {self.rel_error:+.1%}",
               f"ops matched {self.matched}   only simulated {self.sim_only}   "
               f"only real {self.real_only}"]
        out += list(self.details)
        if self.shape_note:
            out.append(self.shape_note)
        return out


def iteration_times(trace: Any) -> dict[int, float]:
    """Per iteration of a trace: last op end - first op start, in ms."""
    spans: dict[int, list[float]] = {}
    for o in trace.ops:
        lo_hi = spans.setdefault(o.iteration, [o.start_us, o.end_us])
        lo_hi[0] = min(lo_hi[0], o.start_us)
        lo_hi[1] = max(lo_hi[1], o.end_us)
    return {it: (hi - lo) / 1e3 for it, (lo, hi) in spans.items()}


def shape_note(sim: Any, trace: Any) -> str:
    notes = []
    p = sim.problem
    info = trace.info
    for name, mine in (("schedule", p.schedule.name), ("pp", p.split.pp),
                       ("microbatches", p.schedule.microbatches),
                       ("split", list(p.split.counts))):
        if name in info and info[name] != mine:
            notes.append(f"{name} {info[name]} (simulated {mine})")
    return "trace differs: " + ", ".join(notes) if notes else ""


def compare(sim: Any, trace: Any) -> Comparison:
    """Simulated iteration against a recorded trace (`ppsim.trace.Trace`)."""
    try:
        from ppsim.diff import diff_traces
    except ImportError:
        return own_compare(sim, trace)
    from ppsim.errors import UserError
    from ppsim.trace import simulation_trace, trace_from_json

    simulated = trace_from_json(simulation_trace(sim), "simulated")
    try:
        d = diff_traces(simulated, trace).to_dict(top=1)
    except UserError as exc:
        own = own_compare(sim, trace)
        return Comparison(**{**own.__dict__, "details": (f"no op-by-op diff: {exc.problem}",)})
    details = []
    kinds = d.get("duration_error", {})
    if kinds:
        details.append("op duration error (median): " + "  ".join(
            f"{k} {v['median']:+.1%}" for k, v in kinds.items()))
    worst = d.get("largest_divergences") or []
    if worst:
        w = worst[0]
        details.append(f"largest: rank {w['rank']} {w['kind']}{w['microbatch']} chunk "
                       f"{w['chunk']} {w['duration_ms'][0]:.3f} -> {w['duration_ms'][1]:.3f} ms")
    if d.get("critical_path_changed"):
        details.append("the critical path differs")
    sim_ms, real_ms = d["iteration_time_ms"]
    only_sim, only_real = d["ops_only_in"]
    return Comparison(trace.path, sim_ms, real_ms, len(trace.iterations), d["ops_matched"],
                      only_sim, only_real, shape_note(sim, trace), tuple(details))


def own_compare(sim: Any, trace: Any) -> Comparison:
    """Iteration times (mean over the trace's iterations) and matched ops."""
    times = iteration_times(trace)
    real = sum(times.values()) / len(times) if times else 0.0
    first = min(times) if times else 0
    real_keys = {o.key for o in trace.ops if o.iteration == first}
    sim_keys = {(o.rank, o.chunk, o.action.microbatch, o.action.kind)
                for ops in sim.timeline.ops for o in ops}
    return Comparison(trace.path, sim.summary.iteration_time_ms, real, len(times),
                      len(real_keys & sim_keys), len(sim_keys - real_keys),
                      len(real_keys - sim_keys), shape_note(sim, trace))
