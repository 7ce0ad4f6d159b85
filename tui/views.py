"""Comparison and navigation actions: pin a split, overlay its lanes, find an op.

A mixin of `ppsim.tui.app.PPSimApp`.
"""

from __future__ import annotations

from typing import Any

from ppsim.tui.screens import FindPrompt
from ppsim.tui.timeline import Timeline


class ViewActions:
    """`b` pin, `v` overlay, `/` find, `n` next match (mixed into the App)."""

    pinned: tuple[int, ...] | None
    show_pinned: bool
    find_query: str
    state: Any

    def action_pin(self) -> None:
        """Pin the current split for comparison; pressed on the pinned split, go back
        to the even split."""
        if self.pinned == self.state.counts:
            self.pinned = None
            self.notify("comparing with the even split")
        else:
            self.pinned = self.state.counts
            self.notify(f"pinned {list(self.state.counts)} for comparison")
        self.resimulate()

    def action_toggle_pinned(self) -> None:
        self.show_pinned = not self.show_pinned
        self._show_timeline(recompare=False)

    def action_find(self) -> None:
        self.push_screen(FindPrompt(self.find_query), self._find)

    def _find(self, query: str | None) -> None:
        if query:
            self.find_query = query
            self.action_find_next()

    def action_find_next(self) -> None:
        if not self.find_query:
            return
        try:
            found = self.query_one(Timeline).find(self.find_query)
        except ValueError as exc:
            self.notify(str(exc), severity="error")
            return
        if not found:
            self.notify(f"no op matches {self.find_query!r}", severity="warning")
        else:
            self.query_one(Timeline).focus()
