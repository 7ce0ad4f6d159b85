"""The status line: one line above the footer that keeps the last message (a refused
edit, the planner's outcome, an assumption) until the next one replaces it, as
lazygit and k9s keep theirs; toasts come and go, this stays."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widget import Widget

from ppsim.tui.text import cut, one_line

SEVERITY_STYLE = {"information": "", "warning": "bold yellow", "error": "bold red"}


@dataclass(kw_only=True, frozen=True)
class StatusMessage:
    """What the status line says."""

    text: str
    """The message, on one line."""
    severity: str = "information"
    """information, warning or error (its colour)."""


class StatusLine(Widget):
    """Renders the current message cut to the width with `…` (never wrapped)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.message = StatusMessage(text="")

    def say(self, text: str, severity: str = "information") -> None:
        self.message = StatusMessage(text=one_line(text), severity=severity)
        self.refresh()

    @property
    def text(self) -> str:
        return self.message.text

    def render(self) -> Text:
        width = max(1, self.size.width)
        return Text(cut(self.message.text, width), no_wrap=True, overflow="crop",
                    style=SEVERITY_STYLE.get(self.message.severity, ""))
