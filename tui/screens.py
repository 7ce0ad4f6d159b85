"""Modal screens: help, and a path prompt (with an optional preview) for export/save/load."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

HELP = """\
[b]ppsim tui[/b] — edit a pipeline split and watch the simulated iteration change.

[b]Split editor[/b] (one row per virtual stage: stage, rank, chunk, layers, first layer;
E = embedding, H = LM head + loss)
  ↑/↓ select a stage     → give it one more layer   ← take one away
  (→/← move its end boundary; the last stage's start)   shift+←/→ move its start boundary
  click a layer on a row: move the nearest boundary there
  c type a count for the stage (the next stage absorbs the difference)

[b]Timeline[/b] (one lane per rank; F forward, B backward, W weight-grad, · idle)
  ←/→ previous/next op   ↑/↓ lane   +/- zoom   0 fit   shift+←/→ scroll

[b]Everywhere[/b]
  u undo   ctrl+y redo   p run the planner and jump to its best split
  e export the split (Megatron flags, layout, torchtitan, DeepSpeed)
  s save the config (TOML)   t load a real trace and compare
  tab move between panels   ctrl+p command palette   ? this help   q quit

Settings: type a value and press Enter; a bad value shows an error and changes nothing.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(HELP, id="help-text")

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(None)


class PathPrompt(ModalScreen[str | None]):
    """Ask for a path; Enter confirms, Escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, default: str = "", preview: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self.preview = preview

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Label(self.title_text, id="prompt-title")
            if self.preview:
                with VerticalScroll(id="prompt-preview"):
                    yield Static(self.preview, markup=False)
            yield Input(self.default, id="prompt-input", placeholder="path")
            yield Label("Enter to confirm, Escape to cancel", classes="dim")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted, "#prompt-input")
    def _submit(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
