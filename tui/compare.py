"""Comparisons the TUI shows: simulated vs a real trace, and current vs pinned split.

Simulated vs real follows `ppsim diff sim real` exactly (ppsim.diff): a is the
simulation, b the real trace, differences are b - a and errors (b - a) / a,
and the real iteration compared is diff's steady-state one (the median-length
iteration after warm-up). When the shapes differ and diff refuses, a small
summary of our own uses the same iteration and the same sign.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from textual.containers import VerticalScroll
from textual.message import Message

from ppsim.errors import UserError
from ppsim.trace.diff import diff_traces, steady_iteration
from ppsim.trace.read import trace_from_json
from ppsim.trace.schema import simulation_trace
from ppsim.tui.text import counts_text, cut
from ppsim.units import fmt_bytes


@dataclass(frozen=True)
class Comparison:
    trace_path: str
    sim_ms: float
    real_ms: float
    """The compared real iteration's time (last op end - first op start)."""
    iteration: int
    """Which real iteration is compared (ppsim.diff.steady_iteration)."""
    iterations: int
    matched: int
    """Ops (rank, chunk, microbatch, kind) present in both."""
    sim_only: int
    real_only: int
    shape_note: str
    """Empty when the trace was run with the simulated schedule and split."""
    details: tuple[str, ...] = ()
    """Extra lines from ppsim diff (duration errors, critical path, worst op)."""
    hidden: bool = False
    """The trace is of another configuration (pp, vpp, microbatches, schedule or
    split): its figures would compare unlike things, so they are not shown."""

    @property
    def rel_error(self) -> float:
        """(real - simulated) / simulated: `ppsim diff sim real`'s iteration_time_error."""
        return (self.real_ms - self.sim_ms) / self.sim_ms if self.sim_ms > 0 else 0.0

    def lines(self) -> list[str]:
        if self.hidden:
            return [f"trace {self.trace_path}", f"{self.shape_note}; its figures are hidden "
                    "(load a trace of this configuration, or set the session to the trace's)"]
        # Figures first, words after: a narrow panel cuts the end of a line.
        out = [f"error {self.rel_error:+.1%}: real iteration {self.iteration} compared (of "
               f"{self.iterations}, as ppsim diff)",
               f"sim {self.sim_ms:.3f} ms  real {self.real_ms:.3f} ms  error=(real-sim)/sim",
               f"ops matched {self.matched}, sim only {self.sim_only}, "
               f"real only {self.real_only}",
               f"trace {self.trace_path}"]
        out += list(self.details)
        if self.shape_note:
            out.append(self.shape_note)
        return out


def _info(trace: Any) -> dict[str, Any]:
    info = getattr(trace, "info", None)
    return info if isinstance(info, dict) else {}


def shape_note(sim: Any, trace: Any) -> str:
    notes = []
    p = sim.problem
    info = _info(trace)
    for name, mine in (("schedule", p.schedule.name), ("pp", p.split.pp),
                       ("vpp", p.split.vpp), ("microbatches", p.schedule.microbatches),
                       ("split", list(p.split.counts))):
        if name in info and info[name] != mine:
            theirs, ours = info[name], mine
            if name == "split" and isinstance(theirs, list):
                theirs, ours = counts_text(theirs, 24), counts_text(mine, 24)
            notes.append(f"{name} {theirs} (simulated {ours})")
    return "trace differs: " + ", ".join(notes) if notes else ""


def compared_iteration(trace: Any) -> int:
    """The real iteration a comparison uses (the one `ppsim diff` picks)."""

    return steady_iteration(trace)


def needs_records(sim: Any, trace: Any) -> bool:
    """True when comparing with `trace` needs the per-op records `sim` was sent without
    (ppsim.tui.child); a trace of another shape is refused from the summary alone."""
    return sim.timeline is None and not shape_note(sim, trace)


def compare(sim: Any, trace: Any) -> Comparison:
    """Simulated iteration against a recorded trace (`ppsim.trace.Trace`)."""

    note = shape_note(sim, trace)
    if note:
        return hidden_comparison(sim, trace, note)
    simulated = trace_from_json(simulation_trace(sim), "simulated")
    try:
        d = diff_traces(simulated, trace).to_dict(top=1)
    except UserError as exc:  # a shape the trace's otherData does not name
        return hidden_comparison(sim, trace, f"trace differs: {exc.problem}")
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
    return Comparison(trace.path, sim_ms, real_ms, d["iterations"][1], len(trace.iterations),
                      d["ops_matched"], only_sim, only_real, "", tuple(details))


def hidden_comparison(sim: Any, trace: Any, note: str) -> Comparison:
    """A trace of another configuration: nothing compared, the mismatch said."""
    return Comparison(trace.path, sim.summary.iteration_time_ms, 0.0,
                      compared_iteration(trace), len(trace.iterations), 0, 0, 0, note,
                      hidden=True)


# ------------------------------------------------------------------ current vs pinned


class RankDelta(NamedTuple):
    rank: int
    busy_ms: tuple[float, float]
    """(pinned, current) compute time of the rank."""
    peak_bytes: tuple[int, int]
    """(pinned, current) peak memory."""

    @property
    def busy_delta_ms(self) -> float:
        return self.busy_ms[1] - self.busy_ms[0]

    @property
    def peak_delta_bytes(self) -> int:
        return self.peak_bytes[1] - self.peak_bytes[0]


def rank_deltas(pinned: Any, current: Any) -> list[RankDelta]:
    """Per rank of two `Summary`s of one pipeline shape: current minus pinned."""
    return [RankDelta(a.rank, (a.busy_ms, b.busy_ms), (a.peak_memory_bytes, b.peak_memory_bytes))
            for a, b in zip(pinned.ranks, current.ranks, strict=False)]


NARROW = 48
"""The wide delta table's width: a narrower panel (an 80-column terminal) gets the
narrow columns, so no figure of it is cut."""


def counts_line(current: Sequence[int], pinned: Sequence[int], which: str, width: int) -> str:
    """`current [..] vs even [..]`; where both lists do not fit and they differ, the
    stages that differ (`current vs even: s1 11 vs 10, s7 9 vs 10`), since two
    lists cut to `[10, …, 10]` would hide the very difference."""
    full = f"current {counts_text(current)} vs {which} {counts_text(pinned)}"
    if len(full) <= width:
        return full
    if len(current) == len(pinned) and list(current) != list(pinned):
        diffs = [f"s{i} {a} vs {b}" for i, (a, b) in enumerate(zip(current, pinned, strict=True))
                 if a != b]
        return cut(f"current vs {which}: " + ", ".join(diffs), width)
    room = max(8, (width - len(f"current  vs {which} ")) // 2)
    return f"current {counts_text(current, room)} vs {which} {counts_text(pinned, room)}"


def delta_table(deltas: list[RankDelta], width: int) -> list[str]:
    """The per-rank table (busy time and peak memory, with their deltas); below
    `NARROW` columns tighter columns that still keep every figure apart."""
    big = max((abs(x) for d in deltas for x in d.busy_ms), default=0.0) >= 1e5
    unit, scale = ("s", 1e3) if big else ("ms", 1.0)  # keep the columns apart
    # Column widths: rank, busy, then Δ busy, peak and Δ peak each after a space that
    # keeps them apart even when a figure outgrows its column.
    w = (4, 9, 9, 9, 10) if width < NARROW else (5, 10, 9, 10, 11)
    out = [f"{'rank':<{w[0]}}{'busy ' + unit:>{w[1]}} {'Δ ' + unit:>{w[2]}}"
           f" {'peak mem' if width >= NARROW else 'peak':>{w[3]}} {'Δ mem':>{w[4]}}"]
    for d in deltas:
        mem = ("-" if d.peak_delta_bytes < 0 else "+") + fmt_bytes(abs(d.peak_delta_bytes))
        out.append(f"{'r' + str(d.rank):<{w[0]}}{d.busy_ms[1] / scale:>{w[1]}.2f}"
                   f" {d.busy_delta_ms / scale:>+{w[2]}.2f} {fmt_bytes(d.peak_bytes[1]):>{w[3]}}"
                   f" {mem:>{w[4]}}")
    return out


def delta_lines(result: Any, width: int = 100) -> list[str]:
    """The comparison panel's text for a `ppsim.tui.session.Result`, worded for `width`
    columns."""

    pin, cur = result.pinned.summary, result.sim.summary
    which = "even split" if result.pinned_is_even else "pinned split"
    if width < 60:
        which = which.split()[0]  # "even" / "pinned": room for the counts
    a, b = cur.iteration_time_ms, pin.iteration_time_ms
    dt = round(a - b, 3) + 0.0  # a rounding residue reads +0.000, not -0.000
    iteration = f"iteration {a:.3f} ms vs {b:.3f} ms ({dt:+.3f} ms)"
    if len(iteration) > width:  # the difference is the figure to keep
        iteration = f"iter {a:.3f} vs {b:.3f} ms ({dt:+.3f})"
    return [counts_line(result.state.counts, result.pinned_counts, which, width), iteration,
            *delta_table(rank_deltas(pin, cur), width)]


def op_delta(sim_op: Any, real_ops: Any) -> str:
    """The real op matching a simulated lane op (same kind, chunk, microbatch), as
    `real start/dur and dur delta (b - a) and error (b - a) / a`, or ''."""
    for o in real_ops:
        if (o.kind, o.chunk, o.microbatch) == (sim_op.kind, sim_op.chunk, sim_op.microbatch):
            dur_a, dur_b = sim_op.end - sim_op.start, o.end - o.start
            err = f" {(dur_b - dur_a) / dur_a:+.1%}" if dur_a > 0 else ""
            return (f"real start {o.start:.3f} ms ({o.start - sim_op.start:+.3f}) dur "
                    f"{dur_b:.3f} ms ({dur_b - dur_a:+.3f}{err})")
    return ""


class CompareBox(VerticalScroll):
    """The compare panel's scroll box: its lines are worded for its width, so a new width
    (a resized terminal, the timeline maximised and back) asks the app to word them again."""

    class Resized(Message):
        """The panel got a new width (the app's `on_compare_box_resized`)."""

    def on_resize(self) -> None:
        self.post_message(self.Resized())
