"""The headline: iteration time, bubble, memory (naming the rank over the limit),
speed-up over the pinned split, and whether a simulation is running."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ppsim.units import fmt_bytes


def over_limit(summary: object, limit: float) -> list[tuple[int, int]]:
    """(rank, bytes over the limit) of every rank that does not fit, worst first."""
    over = [(r.rank, int(r.peak_memory_bytes - limit))
            for r in summary.ranks if not r.fits]  # type: ignore[attr-defined]
    return sorted(over, key=lambda x: (-x[1], x[0]))


def memory_text(summary: object, limit: float) -> str:
    """'fits' or which rank is over and by how much (the worst one, and how many more)."""
    over = over_limit(summary, limit)
    if not over:
        return "fits"
    rank, extra = over[0]
    peak = next(r.peak_memory_bytes for r in summary.ranks  # type: ignore[attr-defined]
                if r.rank == rank)
    more = f" (+{len(over) - 1} more rank{'s' if len(over) > 2 else ''})" if len(over) > 1 \
        else ""
    return (f"DOES NOT FIT: r{rank} {fmt_bytes(extra)} over ({fmt_bytes(peak)} / "
            f"{fmt_bytes(limit)}){more}")


def headline_text(result: object, busy: str = "") -> Text:
    """The two headline lines for a `ppsim.tui.session.Result`; `busy` says what is running."""
    r = result
    s = r.sim.summary  # type: ignore[attr-defined]
    st = r.state  # type: ignore[attr-defined]
    limit = r.sim.problem.hardware.memory_bytes  # type: ignore[attr-defined]
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("iteration ")
    t.append(f"{s.iteration_time_ms:.3f} ms", style="bold")
    t.append("   bubble ")
    t.append(f"{s.bubble_fraction:.1%}", style="bold")
    mem = memory_text(s, limit)
    if s.fits:
        t.append(f"   peak {fmt_bytes(s.peak_memory_bytes)} / {fmt_bytes(limit)} ")
    else:
        t.append("   ")
    t.append(mem, style="bold green" if s.fits else "bold red")
    which = "even split" if r.pinned_is_even else "pinned"  # type: ignore[attr-defined]
    t.append(f"   vs {which} ")
    sp = r.speedup  # type: ignore[attr-defined]
    if sp is not None:
        t.append(f"{sp:.3f}x", style="bold")
        t.append(f" ({r.baseline_ms:.3f} ms)", style="dim")  # type: ignore[attr-defined]
    t.append("\n")
    if busy:
        t.append(busy, style="bold italic yellow")
        t.append("  ")
    t.append(f"{st.schedule}  pp={st.pp} vpp={st.vpp} microbatches={st.microbatches}  "
             f"split={list(st.counts)}   {which}: {list(r.pinned_counts)}",  # type: ignore
             style="dim")
    return t


class Headline(Static):
    """Shows `headline_text` of the latest result."""
