"""Per-rank memory bars against the limit: static | activations | free."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widget import Widget

from ppsim.units import fmt_bytes


@dataclass(frozen=True)
class Bar:
    rank: int
    static_bytes: int
    activation_bytes: int
    peak_bytes: int
    fits: bool


def bars_from_summary(summary: object) -> list[Bar]:
    return [Bar(r.rank, r.static_bytes, r.peak_activation_bytes, r.peak_memory_bytes, r.fits)
            for r in summary.ranks]  # type: ignore[attr-defined]


def bar_cells(bar: Bar, limit: float, width: int) -> tuple[int, int, int]:
    """(static, activation, free) cells of a bar `width` cells long scaled to the limit.

    Each part gets the cells it fills, rounded (a part under half a cell draws
    none: 12.63 MB of 16 GB is not two full cells); the label gives the exact
    figure. Over the limit the bar fills completely (its colour says it does not fit)."""
    if width <= 0:
        return 0, 0, 0
    scale = width / max(limit, bar.peak_bytes, 1)
    s = min(width, round(bar.static_bytes * scale))
    a = min(width - s, round((bar.static_bytes + bar.activation_bytes) * scale) - s)
    return s, max(0, a), width - s - max(0, a)


MIN_BAR = 6
"""The fewest cells a bar shrinks to so that its figures stay whole."""
ROW_HEAD = 4
"""A row's "r12 " before its bar."""


def bar_label(bar: Bar, limit: float, short: bool = False) -> str:
    """The peak, its share of the limit, static and activations; `short`: the last two
    as `= static + act` (the legend names them in that order), without the peak's unit
    and without OVER (the share over 100 % and the bar's colour say it)."""
    pct = bar.peak_bytes / limit if limit > 0 else 0.0
    share = "<1%" if 0 < pct < 0.005 else f"{pct:.0%}"
    peak, static, act = (fmt_bytes(b) for b in (bar.peak_bytes, bar.static_bytes,
                                                bar.activation_bytes))
    if short:
        unit = " " + peak.split()[-1]
        static, act = (v.removesuffix(unit) for v in (static, act))
        return f" {peak} {share} = {static} + {act}"
    flag = "" if bar.fits else " OVER"
    return f" {peak} {share}{flag}  static {static} + act {act}"


def fitted_labels(bars: list[Bar], limit: float, width: int) -> tuple[int, list[str]]:
    """The bars' width (the same for every rank: one scale) and their labels, for rows
    `width` columns wide: a bar shrinks, down to MIN_BAR cells, before a figure is cut,
    and the short labels stand in where the full ones do not fit even then."""
    bar_w = max(10, width // 3)
    labels: list[str] = []
    for short in (False, True):
        labels = [bar_label(b, limit, short) for b in bars]
        room = width - ROW_HEAD - max((len(label) for label in labels), default=0)
        if room >= MIN_BAR:
            return min(bar_w, room), labels
    return MIN_BAR, labels  # cut, with an ellipsis: a rank far over a narrow panel


def legend(limit: float, width: int) -> list[tuple[str, str]]:
    """The header's pieces (text, component class or ''): the longest form that fits."""
    keys = ("memory-bars--static", "memory-bars--activations", "memory-bars--over")
    forms = [(f"memory per rank, limit {fmt_bytes(limit)}  ", ("█ static ", "█ activations ",
                                                              "█ over limit")),
             (f"memory per rank, limit {fmt_bytes(limit)}  ", ("█ static ", "█ act ", "█ over")),
             (f"limit {fmt_bytes(limit)}  ", ("█ static ", "█ act ", "█ over"))]
    for head, names in forms:
        if len(head) + sum(len(n) for n in names) <= width:
            break
    return [(head, ""), *zip(names, keys, strict=True)]


class MemoryBars(Widget):
    COMPONENT_CLASSES = {"memory-bars--static", "memory-bars--activations",
                         "memory-bars--free", "memory-bars--over"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.bars: list[Bar] = []
        self.limit = 1.0

    def set_bars(self, bars: list[Bar], limit: float) -> None:
        self.bars = bars
        self.limit = limit
        if self.styles.height is None or self.styles.height.value != len(bars) + 1:
            self.styles.height = len(bars) + 1
        self.refresh()

    def render(self) -> Text:
        lines = []
        out = Text(no_wrap=True, overflow="crop")
        for text, component in legend(self.limit, self.size.width):
            out.append(text, style=self.get_component_rich_style(component) if component
                       else "bold")
        lines.append(out)
        width, labels = fitted_labels(self.bars, self.limit, self.size.width)
        for bar, label in zip(self.bars, labels, strict=True):
            s, a, f = bar_cells(bar, self.limit, width)
            out = Text(no_wrap=True, overflow="crop")
            out.append(f"r{bar.rank:<3}")
            if bar.fits:
                out.append("█" * s, style=self.get_component_rich_style("memory-bars--static"))
                out.append("█" * a,
                           style=self.get_component_rich_style("memory-bars--activations"))
            else:
                out.append("█" * (s + a),
                           style=self.get_component_rich_style("memory-bars--over"))
            out.append("░" * f, style=self.get_component_rich_style("memory-bars--free"))
            out.append(label)
            lines.append(out)
        for line in lines:
            line.truncate(max(1, self.size.width), overflow="ellipsis")
        return Text("\n", no_wrap=True).join(lines)
