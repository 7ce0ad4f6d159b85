"""A small simulated-vs-real summary until `ppsim diff` exists.

Kept as one plain function with a plain result so the TUI can switch to
ppsim's diff by replacing `compare` alone.
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


def compare(sim: Any, trace: Any) -> Comparison:
    """Simulated iteration against a recorded trace (`ppsim.trace.Trace`)."""
    times = iteration_times(trace)
    real = sum(times.values()) / len(times) if times else 0.0
    first = min(times) if times else 0
    real_keys = {o.key for o in trace.ops if o.iteration == first}
    sim_keys = {(o.rank, o.chunk, o.action.microbatch, o.action.kind)
                for ops in sim.timeline.ops for o in ops}
    notes = []
    p = sim.problem
    info = trace.info
    for name, mine in (("schedule", p.schedule.name), ("pp", p.split.pp),
                       ("microbatches", p.schedule.microbatches),
                       ("split", list(p.split.counts))):
        if name in info and info[name] != mine:
            notes.append(f"{name} {info[name]} (simulated {mine})")
    note = "trace differs: " + ", ".join(notes) if notes else ""
    return Comparison(trace.path, sim.summary.iteration_time_ms, real, len(times),
                      len(real_keys & sim_keys), len(sim_keys - real_keys),
                      len(real_keys - sim_keys), note)
