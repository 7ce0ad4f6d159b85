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
from ppsim.policy.model import StagePolicy
from ppsim.tui.messages import BoundaryMove, CountSet, PolicyKey, StageClick
from ppsim.tui.policy_edit import policy_lines, policy_mark

PREFIX = 26  # "  0 r0  c0   5    0  E H!"
COMPACT = 20  # without the "first" column, below 44 columns
HEADER = f"{'stg':>3} {'rk':<4}{'ch':<3}{'lay':>4}{'first':>6}     layers"
COMPACT_HEADER = f"{'stg':>3} {'rk':<4}{'ch':<3}{'lay':>4}     layers"


def row_prefix(split: Split, index: int, over: bool = False, compact: bool = False,
               policy: str = " ") -> str:
    """A stage's row head; "!" marks a stage whose rank is over the memory limit,
    `policy` is its memory policy's letter (ppsim.tui.policy_edit.policy_mark)."""
    st = split.stages[index]
    marks = ("E" if st.has_embedding else " ") + ("H" if st.has_head else " ")
    flag = "!" if over else " "
    first = "" if compact else f"{st.offset:>6}"
    return f"{st.index:>3} r{st.rank:<3}c{st.chunk:<2}{st.layers:>4}{first} {marks}{flag}{policy}"


def kinds_summary(kinds: tuple[str, ...], offset: int, count: int) -> str:
    """The kinds of layers [offset, offset + count): "3 dense + 5 moe" (in first-seen
    order); '' when the model has no per-layer kinds."""
    if not kinds:
        return ""
    seen: dict[str, int] = {}
    for k in kinds[offset:offset + count]:
        seen[k] = seen.get(k, 0) + 1
    return " + ".join(f"{n} {k}" for k, n in seen.items()) or "no layers"


def bar_layer(cell: int, width: int, num_layers: int) -> int:
    """Which layer a bar cell stands for (the bar spans all layers)."""
    return min(num_layers - 1, cell * num_layers // max(1, width))


class SplitRows(Widget, can_focus=True):
    """The rows; keys move boundaries, a click moves the nearest one to the mouse."""

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Prev stage", show=False),
        Binding("down,j", "cursor(1)", "Next stage", show=False),
        Binding("right,l", "grow", "+1 layer", key_display="→"),
        Binding("left,h", "shrink", "-1 layer", key_display="←"),
        Binding("shift+left", "grow_front", "Take layer from prev", show=False),
        Binding("shift+right", "shrink_front", "Give layer to prev", show=False),
        Binding("m", "policy('modules', 1)", "Recompute", show=False),
        Binding("M", "policy('modules', -1)", "Recompute back", show=False),
        Binding("right_square_bracket", "policy('layers', 1)", "Block N+1", show=False),
        Binding("left_square_bracket", "policy('layers', -1)", "Block N-1", show=False),
        Binding("o", "policy('offload', 1)", "Offload", show=False),
        Binding("O", "policy('offload', -1)", "Offload back", show=False),
        Binding("f", "policy('fraction', 1)", "Offload more", show=False),
        Binding("F", "policy('fraction', -1)", "Offload less", show=False),
    ]
    COMPONENT_CLASSES = {"split-rows--own", "split-rows--other", "split-rows--cursor",
                         "split-rows--ends", "split-rows--over"}

    cursor: reactive[int] = reactive(0)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.split: Split | None = None
        self.over_ranks: frozenset[int] = frozenset()
        self.kinds: tuple[str, ...] = ()
        self.policies: tuple[StagePolicy, ...] = ()

    def set_split(self, split: Split, over_ranks: frozenset[int] = frozenset(),
                  kinds: tuple[str, ...] = (),
                  policies: tuple[StagePolicy, ...] = ()) -> None:
        self.split = split
        self.over_ranks = over_ranks
        self.kinds = kinds if len(kinds) == split.num_layers else ()
        self.policies = policies if len(policies) == split.num_stages else ()
        self.cursor = min(self.cursor, split.num_stages - 1)
        self._fit_height()
        self._caption()
        self.refresh()

    def _policy_lines(self) -> list[str]:
        """The selected stage's policy for this width ([] without policies)."""
        if self.split is None or not self.policies:
            return []
        st = self.split.stages[min(self.cursor, self.split.num_stages - 1)]
        return policy_lines(st.index, self.policies[st.index], st.layers, self.size.width)

    def _fit_height(self) -> None:
        """The header, the rows and the selected stage's policy lines (their count
        depends on the width and on the stage)."""
        if self.split is None:
            return
        height = self.split.num_stages + 1 + len(self._policy_lines())
        if self.styles.height is None or self.styles.height.value != height:
            self.styles.height = height

    def _caption(self) -> None:
        """The selected stage's layer kinds under the panel when the kinds column does
        not fit (whole, never cut to "2de"); nothing when it fits or there are none."""
        parent = self.parent
        if not isinstance(parent, Widget) or self.split is None:
            return
        st = self.split.stages[min(self.cursor, self.split.num_stages - 1)]
        show = bool(self.kinds) and not self._bar_offset()
        parent.border_subtitle = f"stage {st.index}: {self._kinds(st)}" if show else ""

    def on_resize(self) -> None:
        self._fit_height()
        self._caption()

    def watch_cursor(self) -> None:
        self._fit_height()
        self.refresh()
        self._caption()
        self.scroll_cursor_into_view()

    def scroll_cursor_into_view(self) -> None:
        parent = self.parent
        if self.split is not None and isinstance(parent, Widget):
            # keep the selected row (line cursor + 1, under the header) in view
            parent.scroll_to_region(Region(0, self.cursor, 1, 3), animate=False,
                                    immediate=True)

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
        width = max(4, self.size.width - prefix_w - kinds_w)
        for st in self.split.stages:
            is_over = st.rank in self.over_ranks
            mark = policy_mark(self.policies[st.index], st.layers) if self.policies else " "
            prefix = row_prefix(self.split, st.index, is_over, self._compact, mark)
            line = Text(prefix, style=cur if st.index == self.cursor else Style())
            if st.has_embedding or st.has_head:
                line.stylize(ends, prefix_w - 4, prefix_w - 2)
            if is_over:
                line.stylize(over, 0, prefix_w - 1)
            if kinds_w:  # a space first: the policy letter never runs into "12 moe"
                line.append((" " + self._kinds(st)).ljust(kinds_w))
            for c in range(width):
                # a cell is the stage's when their layer ranges overlap, so even a
                # stage narrower than a cell shows (and one with no layers never does)
                lo, hi = c * L / width, (c + 1) * L / width
                mine = st.layers > 0 and st.offset < hi and st.offset + st.layers > lo
                line.append("█" if mine else "·", style=own if mine else other)
            out.append_text(line)
            out.append("\n")
        for text in self._policy_lines():
            out.append(text + "\n", style="bold")
        out.rstrip()
        return out

    @property
    def _compact(self) -> bool:
        return 0 < self.size.width < 44

    @property
    def _prefix(self) -> int:
        return COMPACT if self._compact else PREFIX

    def _bar_offset(self) -> int:
        """The kinds column's width: 0 when it and a bar of 4 cells do not both fit
        (the selected stage's kinds then get a line of their own, never cut)."""
        if self.split is None or not self.kinds:
            return 0
        w = max(len(self._kinds(st)) for st in self.split.stages) + 2
        return w if w + 4 <= self.size.width - self._prefix else 0

    def _kinds(self, st) -> str:  # type: ignore[no-untyped-def]
        return kinds_summary(self.kinds, st.offset, st.layers)

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

    def action_policy(self, knob: str, step: int) -> None:
        """Step one knob of the selected stage's memory policy (the app applies it)."""
        if self.split is not None:
            self.post_message(PolicyKey(self.cursor, knob, step))

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
            yield Input(placeholder="layers (c)", id="count-input", compact=True)

    @property
    def rows(self) -> SplitRows:
        return self.query_one(SplitRows)

    def set_split(self, split: Split, over_ranks: frozenset[int] = frozenset(),
                  kinds: tuple[str, ...] = (),
                  policies: tuple[StagePolicy, ...] = ()) -> None:
        self.rows.set_split(split, over_ranks, kinds, policies)

    def on_resize(self) -> None:
        # a smaller panel must not leave the selected stage (which → edits) out of view
        self.call_after_refresh(self.rows.scroll_cursor_into_view)

    @on(Input.Submitted, "#count-input")
    def _count(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip():  # Enter on an empty field only leaves it
            self.post_message(CountSet(self.rows.cursor, event.value))
        event.input.value = ""
        self.rows.focus()  # leave the field: the panel keys work again

    @on(Input.Blurred, "#count-input")
    def _left(self, event: Input.Blurred) -> None:
        # left without Enter (Escape, tab, a click): the typed count was not applied, so
        # it does not stay in the field to be applied by a later Enter
        event.input.value = ""
