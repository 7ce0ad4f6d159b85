"""The split editor: one row per virtual stage (rank, chunk), layers on a shared axis."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.geometry import Region
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Input, Label

from ppsim.pipeline.split import Split
from ppsim.tui.messages import BoundaryMove, CountSet, StageClick

PREFIX = 26  # "  0 r0  c0   5    0  E H!"
COMPACT = 20  # without the "first" column, below 44 columns
HEADER = f"{'stg':>3} {'rank':<4}{'ch':<2}{'lay':>4}{'first':>6}      layers"
COMPACT_HEADER = f"{'stg':>3} {'rank':<4}{'ch':<2}{'lay':>4}      layers"


def row_prefix(split: Split, index: int, over: bool = False, compact: bool = False) -> str:
    """A stage's row head; "!" marks a stage whose rank is over the memory limit."""
    st = split.stages[index]
    marks = ("E" if st.has_embedding else " ") + ("H" if st.has_head else " ")
    flag = "!" if over else " "
    first = "" if compact else f"{st.offset:>6}"
    return f"{st.index:>3} r{st.rank:<3}c{st.chunk:<2}{st.layers:>4}{first} {marks}{flag} "


def kinds_summary(kinds: tuple[str, ...], offset: int, count: int) -> str:
    """The kinds of layers [offset, offset + count): "3 dense + 5 moe" (in first-seen
    order); '' when the model has no per-layer kinds."""
    if not kinds:
        return ""
    seen: dict[str, int] = {}
    for k in kinds[offset:offset + count]:
        seen[k] = seen.get(k, 0) + 1
    return " + ".join(f"{n} {k}" for k, n in seen.items()) or "no layers"


def short_kinds(summary: str) -> str:
    """A kinds summary for a narrow column: "3 dense + 5 moe" -> "3de+5mo"."""
    if summary in ("", "no layers"):
        return summary and "-"
    return "+".join(f"{n}{k[:2]}" for n, k in (part.split(" ", 1)
                                               for part in summary.split(" + ")))


def bar_layer(cell: int, width: int, num_layers: int) -> int:
    """Which layer a bar cell stands for (the bar spans all layers)."""
    return min(num_layers - 1, cell * num_layers // max(1, width))


class SplitRows(Widget, can_focus=True):
    """The rows; keys move boundaries, a click moves the nearest one to the mouse."""

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Prev stage", show=False),
        Binding("down,j", "cursor(1)", "Next stage", show=False),
        Binding("right,l", "grow", "Stage +1 layer", show=False),
        Binding("left,h", "shrink", "Stage -1 layer", show=False),
        Binding("shift+left", "grow_front", "Take layer from prev", show=False),
        Binding("shift+right", "shrink_front", "Give layer to prev", show=False),
    ]
    COMPONENT_CLASSES = {"split-rows--own", "split-rows--other", "split-rows--cursor",
                         "split-rows--ends", "split-rows--over"}

    cursor: reactive[int] = reactive(0)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.split: Split | None = None
        self.over_ranks: frozenset[int] = frozenset()
        self.kinds: tuple[str, ...] = ()

    def set_split(self, split: Split, over_ranks: frozenset[int] = frozenset(),
                  kinds: tuple[str, ...] = ()) -> None:
        self.split = split
        self.over_ranks = over_ranks
        self.kinds = kinds if len(kinds) == split.num_layers else ()
        self.cursor = min(self.cursor, split.num_stages - 1)
        if self.styles.height is None or self.styles.height.value != split.num_stages + 1:
            self.styles.height = split.num_stages + 1
        self.refresh()

    def watch_cursor(self) -> None:
        self.refresh()
        parent = self.parent
        if self.split is not None and isinstance(parent, Widget):
            # keep the selected row (line cursor + 1, under the header) in view
            parent.scroll_to_region(Region(0, self.cursor, 1, 3), animate=False)

    def render(self) -> Text:
        out = Text(no_wrap=True, overflow="crop")
        head = COMPACT_HEADER if self._compact else HEADER
        out.append(head[:self.size.width] + "\n", style="bold")
        if self.split is None:
            return out
        prefix_w = self._prefix
        own = self.get_component_rich_style("split-rows--own")
        other = self.get_component_rich_style("split-rows--other")
        cur = self.get_component_rich_style("split-rows--cursor")
        ends = self.get_component_rich_style("split-rows--ends")
        over = self.get_component_rich_style("split-rows--over")
        L = self.split.num_layers
        kinds_w = self._bar_offset()
        width = self.size.width - prefix_w - kinds_w
        width = width if width >= 4 or not kinds_w else 0  # kinds first when narrow
        width = max(width, 0 if kinds_w else 4)
        for st in self.split.stages:
            is_over = st.rank in self.over_ranks
            prefix = row_prefix(self.split, st.index, is_over, self._compact)
            line = Text(prefix, style=cur if st.index == self.cursor else Style())
            if st.has_embedding or st.has_head:
                line.stylize(ends, prefix_w - 4, prefix_w - 2)
            if is_over:
                line.stylize(over, 0, prefix_w - 1)
            if kinds_w:
                line.append(self._kinds(st)[:kinds_w - 1].ljust(kinds_w))
            for c in range(width):
                # a cell is the stage's when their layer ranges overlap, so even a
                # stage narrower than a cell shows (and one with no layers never does)
                lo, hi = c * L / width, (c + 1) * L / width
                mine = st.layers > 0 and st.offset < hi and st.offset + st.layers > lo
                line.append("█" if mine else "·", style=own if mine else other)
            out.append_text(line)
            out.append("\n")
        out.rstrip()
        return out

    @property
    def _compact(self) -> bool:
        return 0 < self.size.width < 44

    @property
    def _prefix(self) -> int:
        return COMPACT if self._compact else PREFIX

    def _bar_offset(self) -> int:
        if self.split is None or not self.kinds:
            return 0
        w = max(len(self._kinds(st)) for st in self.split.stages)
        return min(w + 1, max(0, self.size.width - self._prefix))

    def _kinds(self, st) -> str:  # type: ignore[no-untyped-def]
        """The stage's kinds, in the short form when the long one does not fit."""
        assert self.split is not None
        full = [kinds_summary(self.kinds, s.offset, s.layers) for s in self.split.stages]
        text = kinds_summary(self.kinds, st.offset, st.layers)
        if max(map(len, full)) + 5 <= self.size.width - self._prefix:
            return text  # the long form and a bar of 4 cells or more
        return short_kinds(text)

    def action_cursor(self, step: int) -> None:
        if self.split is not None:
            self.cursor = max(0, min(self.split.num_stages - 1, self.cursor + step))

    def _is_last(self) -> bool:
        return self.split is not None and self.cursor == self.split.num_stages - 1 \
            and self.cursor > 0

    def action_grow(self) -> None:
        # the last stage has no end boundary: it grows at its start
        if self._is_last():
            self.post_message(BoundaryMove(self.cursor - 1, -1))
        else:
            self.post_message(BoundaryMove(self.cursor, +1))

    def action_shrink(self) -> None:
        if self._is_last():
            self.post_message(BoundaryMove(self.cursor - 1, +1))
        else:
            self.post_message(BoundaryMove(self.cursor, -1))

    def action_grow_front(self) -> None:
        self.post_message(BoundaryMove(self.cursor - 1, -1))

    def action_shrink_front(self) -> None:
        self.post_message(BoundaryMove(self.cursor - 1, +1))

    def on_click(self, event: events.Click) -> None:
        if self.split is None or event.y < 1 or event.y > self.split.num_stages:
            return
        stage = event.y - 1
        self.cursor = stage
        start = self._prefix + self._bar_offset()
        if event.x >= start:
            width = max(4, self.size.width - start)
            layer = bar_layer(event.x - start, width, self.split.num_layers)
            self.post_message(StageClick(stage, layer))


class SplitEditor(Vertical):
    """Rows plus a field to type a stage's count directly."""

    def compose(self) -> ComposeResult:
        yield SplitRows(id="split-rows")
        with Horizontal(id="count-row"):
            yield Label("count ", id="count-label")
            yield Input(placeholder="layers for the selected stage", id="count-input",
                        compact=True)
        yield Label("", id="split-error", classes="error")

    @property
    def rows(self) -> SplitRows:
        return self.query_one(SplitRows)

    def set_split(self, split: Split, over_ranks: frozenset[int] = frozenset(),
                  kinds: tuple[str, ...] = ()) -> None:
        self.rows.set_split(split, over_ranks, kinds)

    def show_error(self, text: str) -> None:
        label = self.query_one("#split-error", Label)
        label.update(text)
        label.set_class(bool(text), "-shown")

    @on(Input.Submitted, "#count-input")
    def _count(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(CountSet(self.rows.cursor, event.value))
