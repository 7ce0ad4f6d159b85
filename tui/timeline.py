"""The Gantt timeline: a Line-API scroll view, one lane per rank.

Only visible lines are rendered (`render_line`), each from `ppsim.tui.lanes.lane_cells`
for the visible columns, and rendered strips are kept in an LRU cache keyed on
everything that changes them, so scrolling back and redraws are cheap.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ppsim.tui.lanes import (
    Lane,
    LaneOp,
    find_op,
    fit_scale,
    fmt_ms,
    lane_cells,
    ruler,
    zoom_scroll,
    zoomed_scale,
)
from ppsim.tui.messages import CursorMoved

GUTTER = 8
KIND_CLASS = {"F": "timeline--forward", "B": "timeline--backward", "W": "timeline--weight",
              "O": "timeline--copy", "R": "timeline--copy", "C": "timeline--comm",
              "D": "timeline--dp"}
SHADE_CLASS = {"F": "timeline--forward-late", "B": "timeline--backward-late",
               "W": "timeline--weight-late", "O": "timeline--copy", "R": "timeline--copy",
               "C": "timeline--comm", "D": "timeline--dp"}
"""Ops of a rank's later chunks (virtual stages) are drawn a shade darker."""
MAX_CELLS = 2_000_000


class Timeline(ScrollView, can_focus=True):
    """Zoom with + / -, fit with 0, move the cursor between ops with the arrows."""

    BINDINGS = [
        Binding("left", "cursor_op(-1)", "Prev op", show=False),
        Binding("right", "cursor_op(1)", "Next op", show=False),
        Binding("up", "cursor_lane(-1)", "Lane up", show=False),
        Binding("down", "cursor_lane(1)", "Lane down", show=False),
        Binding("plus,equals_sign", "zoom(0.5)", "Zoom", key_display="+/-"),
        Binding("minus", "zoom(2.0)", "Zoom out", show=False),
        Binding("0", "fit", "Fit"),
        Binding("z", "app.maximise", "Full screen"),
        Binding("shift+left", "pan(-1)", "Scroll left", show=False),
        Binding("shift+right", "pan(1)", "Scroll right", show=False),
        Binding("home", "first_op", "First op", show=False),
        Binding("end", "last_op", "Last op", show=False),
    ]
    COMPONENT_CLASSES = {"timeline--forward", "timeline--backward", "timeline--weight",
                         "timeline--forward-late", "timeline--backward-late",
                         "timeline--weight-late", "timeline--copy", "timeline--comm",
                         "timeline--dp", "timeline--idle", "timeline--cursor",
                         "timeline--label", "timeline--ruler"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lanes: list[Lane] = []
        self.end_ms = 0.0
        self.ms_per_cell = 1.0
        self.cursor: tuple[int, int] = (0, 0)
        self._fitted = True
        self._target_x: int | None = None
        """Where a zoom asked the view to scroll (applied after the next refresh): the
        next zoom starts from it, so keys pressed faster than frames keep the cursor."""
        self._cache: LRUCache[tuple, Strip] = LRUCache(1024)
        self._generation = 0
        self.lines_rendered = 0
        """Lines built (not served from the cache): for tests and benchmarks."""

    # ------------------------------------------------------------ data

    def set_lanes(self, lanes: list[Lane]) -> None:
        """New lanes (after a re-simulation): keep the zoom unless it was 'fit'."""
        self.lanes = lanes
        self.end_ms = max((lane.end for lane in lanes), default=0.0)
        lane, op = self.cursor
        lane = min(lane, max(0, len(lanes) - 1))
        op = min(op, len(lanes[lane].ops) - 1) if lanes else -1
        self.cursor = (lane, max(op, 0))
        if self._fitted or self.ms_per_cell <= 0:
            self.ms_per_cell = fit_scale(self.end_ms, self._view_width())
        self._changed()
        self._post_cursor()

    @property
    def total_cells(self) -> int:
        return int(self.end_ms / self.ms_per_cell) + 1 if self.ms_per_cell > 0 else 1

    def _view_width(self) -> int:
        return max(10, (self.size.width or 80) - GUTTER - 1)

    def _changed(self) -> None:
        self._generation += 1
        self._cache.clear()
        self.virtual_size = Size(GUTTER + self.total_cells, len(self.lanes) + 1)
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()

    def on_resize(self, event: events.Resize) -> None:
        if self._fitted and self.lanes:
            self.ms_per_cell = fit_scale(self.end_ms, self._view_width())
            self._changed()
            self._post_cursor()  # the scale on the border and the cursor line follow

    # ------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        row = 0 if y == 0 else y + scroll_y
        cur_lane, cur_op = self.cursor
        focused = self.has_focus
        key = (self._generation, row, scroll_x, width,
               (cur_op, focused) if row - 1 == cur_lane else None)
        strip = self._cache.get(key)
        if strip is None:
            strip = self._build_line(row, scroll_x, width)
            self._cache[key] = strip
        return strip

    def _build_line(self, row: int, x0: int, width: int) -> Strip:
        self.lines_rendered += 1
        cells = max(0, width - GUTTER)
        label_style = self.get_component_rich_style("timeline--label")
        if row == 0:
            text = ruler(self.ms_per_cell, x0, cells)
            segs = [Segment("time".ljust(GUTTER), label_style),
                    Segment(text, self.get_component_rich_style("timeline--ruler"))]
            return Strip(segs, width)
        index = row - 1
        if index >= len(self.lanes):
            return Strip.blank(width, self.rich_style)
        lane = self.lanes[index]
        cur_lane, cur_op = self.cursor
        force = cur_op if index == cur_lane else -1
        styles = {k: self.get_component_rich_style(c) for k, c in KIND_CLASS.items()}
        late = {k: self.get_component_rich_style(c) for k, c in SHADE_CLASS.items()}
        idle = self.get_component_rich_style("timeline--idle")
        cursor = self.get_component_rich_style("timeline--cursor") if self.has_focus \
            else Style(underline=True)
        segs = [Segment(lane.label[:GUTTER - 1].ljust(GUTTER), label_style)]
        for cell in lane_cells(lane, self.ms_per_cell, x0, cells, force=force):
            if cell.op < 0:
                style = idle
            else:
                op = lane.ops[cell.op]
                style = (late if op.chunk % 2 else styles).get(op.kind, idle)
                if cell.op == force:
                    style = style + cursor
            segs.append(Segment(cell.text, style))
        return Strip(segs, width)

    def text_lines(self) -> list[str]:
        """The visible lines as plain text (rendered-text tests)."""
        return [self.render_line(y).text for y in range(self.size.height)]

    # ------------------------------------------------------------ cursor

    def current_op(self) -> LaneOp | None:
        """The op under the cursor (None where the cursor's lane or op is gone)."""
        lane, op = self.cursor
        if 0 <= lane < len(self.lanes) and 0 <= op < len(self.lanes[lane].ops):
            return self.lanes[lane].ops[op]
        return None

    def cursor_text(self) -> str:
        op = self.current_op()
        if op is None:
            return "no op"
        lane = self.lanes[self.cursor[0]]
        what = f"{op.kind}{op.microbatch} chunk {op.chunk} stage {op.stage}" \
            if op.microbatch >= 0 else f"{op.kind} (the step's)"
        return f"{lane.label} {what} | start {op.start:.3f} ms dur {op.end - op.start:.3f} ms"

    def _set_cursor(self, lane: int, op: int) -> None:
        self.cursor = (lane, op)
        self._scroll_to_cursor()
        self.refresh()
        self._post_cursor()

    def _post_cursor(self) -> None:
        self.post_message(CursorMoved(*self.cursor))

    def _scroll_to_cursor(self) -> None:
        op = self.current_op()
        if op is None:
            return
        x = int(op.start / self.ms_per_cell)
        view = self._view_width()
        if not self.scroll_x <= x < self.scroll_x + view:
            self.scroll_to(x=max(0, x - view // 3), animate=False, immediate=True)
        lane = self.cursor[0]
        rows = max(1, self.size.height - 2)
        if not self.scroll_y <= lane < self.scroll_y + rows:
            self.scroll_to(y=max(0, lane - rows + 1), animate=False, immediate=True)

    def action_cursor_op(self, step: int) -> None:
        lane, op = self.cursor
        if self.lanes and self.lanes[lane].ops:
            self._set_cursor(lane, max(0, min(len(self.lanes[lane].ops) - 1, op + step)))

    def action_cursor_lane(self, step: int) -> None:
        lane, _ = self.cursor
        new = max(0, min(len(self.lanes) - 1, lane + step))
        op = self.current_op()
        if new != lane and op is not None:
            self._set_cursor(new, max(0, self.lanes[new].at_time((op.start + op.end) / 2)))

    def action_first_op(self) -> None:
        self._set_cursor(self.cursor[0], 0)

    def action_last_op(self) -> None:
        lane = self.cursor[0]
        if self.lanes:
            self._set_cursor(lane, max(0, len(self.lanes[lane].ops) - 1))

    def action_zoom(self, factor: float) -> None:
        fit = fit_scale(self.end_ms, self._view_width())
        new = zoomed_scale(self.ms_per_cell, factor, fit, self.end_ms / MAX_CELLS)
        op = self.current_op()
        old, x0 = self.ms_per_cell, self._target_x if self._target_x is not None \
            else int(self.scroll_x)
        self._fitted = new >= fit
        self.ms_per_cell = fit if self._fitted else new
        self._changed()
        if self._fitted:
            self._target_x = None
            self.scroll_to(x=0, animate=False, immediate=True)
        elif op is not None:
            # the cursor's op stays where it was on screen (in view if it was not)
            self._target_x = zoom_scroll((op.start + op.end) / 2, old, self.ms_per_cell,
                                         x0, self._view_width())
            # after the refresh that applies the new virtual size (it bounds scroll_x)
            self.call_after_refresh(self._apply_target)
        self._post_cursor()  # the cursor line's "per cell" follows the zoom

    def _apply_target(self) -> None:
        if self._target_x is not None:
            self.scroll_to(x=self._target_x, animate=False, immediate=True)
            self._target_x = None

    def action_fit(self) -> None:
        self._fitted = True
        self._target_x = None
        self.ms_per_cell = fit_scale(self.end_ms, self._view_width())
        self._changed()
        self.scroll_to(x=0, animate=False, immediate=True)
        self._post_cursor()

    def refit(self) -> None:
        """After the width changed (maximised): fit again if the view was fitted."""
        if self._fitted and self.lanes:
            self.action_fit()

    def action_pan(self, direction: int) -> None:
        step = max(1, self._view_width() // 2)
        self.scroll_to(x=max(0, self.scroll_x + direction * step), animate=False,
                       immediate=True)

    def find(self, query: str) -> bool:
        """Move the cursor to the next op matching `query` (ppsim.tui.lanes.find_op)."""
        hit = find_op(self.lanes, query, self.cursor)
        if hit is None:
            return False
        self._set_cursor(*hit)
        return True

    def _on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self._wheel(event, +1)

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self._wheel(event, -1)

    def _wheel(self, event: events.MouseEvent, direction: int) -> None:
        """The wheel scrolls the lanes when they overflow, else (and with shift) time."""
        event.stop()
        event.prevent_default()
        if self.max_scroll_y > 0 and not event.shift:
            self.scroll_to(y=max(0, self.scroll_y + direction * 2), animate=False,
                           immediate=True)
        else:
            step = max(1, self._view_width() // 8)
            self.scroll_to(x=max(0, self.scroll_x + direction * step), animate=False,
                           immediate=True)

    def on_click(self, event: events.Click) -> None:
        """Select the op under the mouse (event offsets include the border)."""
        at = event.get_content_offset(self)
        if at is None:
            return
        lane = at.y - 1 + int(self.scroll_y)
        if at.y < 1 or not 0 <= lane < len(self.lanes) or at.x < GUTTER:
            return
        x = at.x - GUTTER + int(self.scroll_x)
        op = self.lanes[lane].overlapping(x * self.ms_per_cell, (x + 1) * self.ms_per_cell)
        if op < 0:
            op = self.lanes[lane].at_time((x + 0.5) * self.ms_per_cell)
        if op >= 0:
            self._set_cursor(lane, op)

    def describe_scale(self) -> str:
        return f"{fmt_ms(self.ms_per_cell)} per cell"
