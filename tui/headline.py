"""The headline: iteration time, bubble, memory (naming the rank over the limit),
speed-up over the pinned split, throughput in users' units (tokens/s per GPU,
TFLOP/s/GPU, MFU), and whether a simulation is running."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ppsim.job.throughput import tflops_text
from ppsim.tui.text import counts_text
from ppsim.units import fmt_bytes


def over_limit(summary: object, limit: float) -> list[tuple[int, int]]:
    """(rank, bytes over the limit) of every rank that does not fit, worst first."""
    over = [(r.rank, int(r.peak_memory_bytes - limit))
            for r in summary.ranks if not r.fits]  # type: ignore[attr-defined]
    return sorted(over, key=lambda x: (-x[1], x[0]))


def memory_text(summary: object, limit: float, no_split: bool = False,
                compact: bool = False) -> str:
    """'fits' or which rank is over and by how much (the worst one, and how many more);
    `no_split`: no split of this shape fits either (the planner's memory floor);
    `compact`: the rank and its excess only (the memory bars give the rest)."""
    over = over_limit(summary, limit)
    if not over:
        return "fits"
    rank, extra = over[0]
    peak = next(r.peak_memory_bytes for r in summary.ranks  # type: ignore[attr-defined]
                if r.rank == rank)
    more = f" (+{len(over) - 1} more rank{'s' if len(over) > 2 else ''})" if len(over) > 1 \
        else ""
    verdict = "NO SPLIT FITS" if no_split else "DOES NOT FIT"
    if compact:
        return f"{verdict}: r{rank} +{fmt_bytes(extra)}"
    return (f"{verdict}: r{rank} {fmt_bytes(extra)} over ({fmt_bytes(peak)} / "
            f"{fmt_bytes(limit)}){more}")


def _parts(result: object, compact: bool) -> list[tuple[str, str]]:
    """The first line's (text, style) pieces; `compact` for a narrow terminal."""
    r = result
    s = r.sim.summary  # type: ignore[attr-defined]
    limit = r.sim.problem.hardware.memory_bytes  # type: ignore[attr-defined]
    which = "even" if r.pinned_is_even else "pinned"  # type: ignore[attr-defined]
    mem_style = "bold green" if s.fits else "bold red"
    parts = [("iter " if compact else "iteration ", ""),
             (f"{s.iteration_time_ms:.3f} ms", "bold"),
             ("  bubble " if compact else "   bubble ", ""), (f"{s.bubble_fraction:.1%}", "bold")]
    if s.fits:
        peak = (f"  {fmt_bytes(s.peak_memory_bytes)}/{fmt_bytes(limit)} " if compact
                else f"   peak {fmt_bytes(s.peak_memory_bytes)} / {fmt_bytes(limit)} ")
        parts += [(peak, ""), ("fits", mem_style)]
    else:
        parts += [("  " if compact else "   ", ""),
                  (memory_text(s, limit, r.no_split_fits, compact), mem_style)]  # type: ignore[attr-defined]
    sp = r.speedup  # type: ignore[attr-defined]
    if sp is not None:
        if compact:
            parts += [("  ", ""), (f"{sp:.3f}x", "bold"), (f" vs {which}", "")]
        else:
            parts += [(f"   vs {which} split " if which == "even" else "   vs pinned ", ""),
                      (f"{sp:.3f}x", "bold"),
                      (f" ({r.baseline_ms:.3f} ms)", "dim")]  # type: ignore[attr-defined]
    return parts


MIN_COUNTS_ROOM = 8
"""Fewer columns than this for each split list on the headline: the lists are left out."""


def throughput_text(result: object, compact: bool = False) -> str:
    """The iteration's throughput in the units training logs print, as `ppsim simulate`
    formats them (ppsim.job.throughput.line), after the job's GPUs where it has more
    than one replica or tp/cp > 1: tokens/s per GPU, TFLOP/s per GPU, MFU,
    FP8 (or NVFP4) when its matmuls are, A2A overlap under Megatron's combined 1F1B; '' for a
    model without tokens or FLOPs (uniform costs)."""
    sim = result.sim  # type: ignore[attr-defined]
    job = getattr(sim.problem.hardware, "job", None)
    t = job.throughput(sim.summary.iteration_time_ms) if job is not None else None
    if t is None:
        return ""
    tokens = f"{t.tokens_per_s_per_gpu:,.0f} tok/s/GPU" if compact else \
        f"{t.tokens_per_s_per_gpu:,.0f} tokens/s/GPU"
    sep = " " if compact else "  "
    gpus = job.shape.gpus  # named where the job is more than its pipeline's ranks
    tokens = f"{gpus} GPUs{sep}{tokens}" if gpus > job.shape.sizes.pp else tokens
    fp8 = f"{sep}{job.arch.quantized_kind}" if job.arch.fp8 else ""
    a2a = f"{sep}A2A overlap" if job.overlap_moe_expert_parallel_comm else ""
    return (f"{tokens}{sep}{tflops_text(t.tflops_per_gpu)} TFLOP/s/GPU{sep}MFU {t.mfu:.1%}"
            f"{fp8}{a2a}")


def headline_text(result: object, busy: str = "", width: int | None = None) -> Text:
    """The two headline lines for a `ppsim.tui.session.Result` in `width` columns (a
    shorter wording when the full one does not fit; what is still cut ends in `…`);
    `busy` says what is running."""
    parts = _parts(result, compact=False)
    if width is not None and sum(len(p) for p, _ in parts) > width:
        parts = _parts(result, compact=True)
    used = sum(len(p) for p, _ in parts) + 3
    rate = throughput_text(result)
    if width is not None and used + len(rate) > width:  # the short units may still fit
        rate = throughput_text(result, compact=True)
    first = width is None or used + len(rate) <= width
    if rate and first:  # room on the first line: the second keeps its split lists
        parts += [("   ", ""), (rate, "bold")]
    t = Text(no_wrap=True, overflow="ellipsis")
    for piece, style in parts:
        t.append(piece, style=style)
    t.append("\n")
    if busy:
        t.append(busy, style="bold italic yellow")
        t.append("  ")
    for piece, style in _second_line(result, len(busy) + 2 * bool(busy), width,
                                     with_rate=not first):
        t.append(piece, style=style)
    return t


def _second_line(result: object, used: int, width: int | None,
                 with_rate: bool) -> list[tuple[str, str]]:
    """Throughput (`with_rate`: it had no room on the first line), shape and the split
    lists in the columns `used` leaves: the full wording, else the compact one, else the
    compact one without the lists (the split and compare panels show them)."""
    r = result
    st = r.state  # type: ignore[attr-defined]
    which = "even" if r.pinned_is_even else "pinned"  # type: ignore[attr-defined]
    for compact in (False, True):
        rate = throughput_text(result, compact) if with_rate else ""
        shape = f"{st.schedule}  pp={st.pp} vpp={st.vpp} microbatches={st.microbatches}  " \
            "split=" if not compact else \
            f"{st.schedule} pp={st.pp} vpp={st.vpp} m={st.microbatches} split="
        head = [(rate, "bold"), ("  ", "")] if rate else []  # what a log is compared with
        if width is None:
            room = None
        else:
            room = (width - used - len(rate) - 2 * bool(rate) - len(shape) - len(which) - 5) // 2
            if room < MIN_COUNTS_ROOM:
                if not compact:
                    continue
                short = shape.removesuffix(" split=")
                if used + len(rate) + 2 + len(short) > width:
                    return head[:1]  # the shape is in the settings panel
                return head + [(short, "dim")]
        return head + [(f"{shape}{counts_text(st.counts, room)}   {which}: "
                        f"{counts_text(r.pinned_counts, room)}", "dim")]  # type: ignore
    return []


class Headline(Static):
    """Shows `headline_text` of the latest result, worded for the widget's width."""

    def __init__(self, text: str = "", *, id: str | None = None) -> None:
        super().__init__(text, id=id, markup=False)
        self.result: object | None = None
        self.busy = ""

    def show(self, result: object | None, busy: str = "") -> None:
        """The result's numbers (None: `busy` alone), and what runs."""
        self.result, self.busy = result, busy
        self.update(self._text())

    def _text(self) -> Text | str:
        if self.result is None:
            return self.busy
        return headline_text(self.result, self.busy, max(1, self.size.width - 2))

    def on_resize(self) -> None:
        if self.result is not None:
            self.update(self._text())
