"""The warning lines under the headline: what the CLI would print on stderr for the
shown state (ppsim.tui.cautions), wrapped rather than cut; hidden when there are none."""

from __future__ import annotations

from textual.widgets import Static


class WarningBar(Static):
    """Shows the lines it is given, one paragraph each; not displayed without any."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.lines: tuple[str, ...] = ()

    def show(self, lines: tuple[str, ...]) -> None:
        self.lines = lines
        self.update("\n".join(lines))
        self.set_class(bool(lines), "-shown")
