"""The key bar at the bottom, rebuilt only when the keys it shows change."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widgets import Footer

COMPACT_BELOW = 100
"""Below this many columns the keys go without padding (the timeline's keys then fit 80)."""


def shown_keys(screen: Screen) -> tuple[tuple[Any, ...], ...]:
    """What a footer draws for `screen`: each shown binding's key, words, action, group,
    whether it is enabled and its tooltip."""
    return tuple((b.key, b.key_display, b.description, b.action, b.group, enabled, tooltip)
                 for _, b, enabled, tooltip in screen.active_bindings.values() if b.show)


class KeyFooter(Footer):
    """Textual's footer, which rebuilds its keys whenever the focus moves (every field
    entered or left, every panel switched: a third of a keypress's time in the TUI);
    this one only when the keys shown differ."""

    _shown: tuple[tuple[Any, ...], ...] | None = None

    def on_resize(self) -> None:
        self.compact = 0 < self.size.width < COMPACT_BELOW

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus or not self.is_attached or screen is not self.screen:
            return
        keys = shown_keys(screen)
        if keys != self._shown:
            self._shown = keys
            self.call_after_refresh(self.recompose)
