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


def bar_label(bar: Bar, limit: float) -> str:
    flag = "" if bar.fits else " OVER"
    pct = bar.peak_bytes / limit if limit > 0 else 0.0
    share = "<1%" if 0 < pct < 0.005 else f"{pct:.0%}"
    return (f" {fmt_bytes(bar.peak_bytes)} {share}{flag}  static "
            f"{fmt_bytes(bar.static_bytes)} + act {fmt_bytes(bar.activation_bytes)}")


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
        out.append(f"memory per rank, limit {fmt_bytes(self.limit)}  ", style="bold")
        out.append("█ static ", style=self.get_component_rich_style("memory-bars--static"))
        out.append("█ activations ",
                   style=self.get_component_rich_style("memory-bars--activations"))
        out.append("█ over limit", style=self.get_component_rich_style("memory-bars--over"))
        lines.append(out)
        width = max(10, self.size.width // 3)
        for bar in self.bars:
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
            out.append(bar_label(bar, self.limit))
            lines.append(out)
        for line in lines:
            line.truncate(max(1, self.size.width), overflow="ellipsis")
        return Text("\n", no_wrap=True).join(lines)
