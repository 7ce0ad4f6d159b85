"""The headline numbers: iteration time, bubble, memory, speed-up over the even split."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ppsim.report import fmt_bytes


def headline_text(result: object, busy: bool = False) -> Text:
    """The two headline lines for a `tui.session.Result`."""
    r = result
    s = r.sim.summary  # type: ignore[attr-defined]
    st = r.state  # type: ignore[attr-defined]
    limit = r.sim.problem.hardware.memory_bytes  # type: ignore[attr-defined]
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("iteration ")
    t.append(f"{s.iteration_time_ms:.3f} ms", style="bold")
    t.append("   bubble ")
    t.append(f"{s.bubble_fraction:.1%}", style="bold")
    t.append(f"   peak memory {fmt_bytes(s.peak_memory_bytes)} / {fmt_bytes(limit)} ")
    t.append("fits" if s.fits else "DOES NOT FIT", style="bold green" if s.fits else "bold red")
    t.append("   vs even split ")
    sp = r.speedup  # type: ignore[attr-defined]
    if sp is None:
        t.append("n/a (layers do not divide evenly)", style="dim")
    else:
        t.append(f"{sp:.3f}x", style="bold")
        t.append(f" ({r.baseline_ms:.3f} ms)", style="dim")  # type: ignore[attr-defined]
    t.append("\n")
    t.append(f"{st.schedule}  pp={st.pp} vpp={st.vpp} microbatches={st.microbatches}  "
             f"split={list(st.counts)}   even split: {_even(r)}", style="dim")
    if busy:
        t.append("  simulating…", style="italic")
    return t


def _even(result: object) -> str:
    counts = result.baseline_counts  # type: ignore[attr-defined]
    return "n/a" if counts is None else str(list(counts))


class Headline(Static):
    """Shows `headline_text` of the latest result."""
