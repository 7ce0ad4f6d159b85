"""Modal screens: help, and a path prompt (with an optional preview) for export/save/load."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

HELP = """\
[b]ppsim tui[/b]: edit a pipeline split, watch the simulated iteration change.
[b]Close this help with Escape, q or ?[/b] (it scrolls: ↑/↓, PgUp/PgDn).

[b]Panels[/b]  1 settings  2 split  3 timeline  4 compare + memory
  tab cycles; the focused panel has a bright border and the footer shows
  its keys; z gives the timeline the whole screen (z again: back)
  The status line above the footer keeps the last message (a refusal,
  the planner's outcome) until the next one.

[b]Settings[/b]  type a value and press Enter (or leave the field); Escape
  puts it back. A refused value is put back and the reason is on the
  status line. Below 100 columns: sched = schedule, recomp = recompute,
  hw = hardware, m = microbatches, mem GB = memory per rank.

[b]Split editor[/b]  a row per virtual stage: stage, rank, chunk, layers,
  first layer; E = embedding, H = LM head + loss, ! = the rank is over
  the memory limit; layer kinds ("3 dense + 5 moe") in a column, or for
  the selected stage under the panel when the column does not fit
  ↑/↓ (k/j) select a stage   → (l) one layer more   ← (h) one less
  (→/← move its end boundary, the last stage's start; shift+←/→ its
  start)   click a layer on a row: move the nearest boundary there
  c type a count for the stage (the next stage absorbs the difference)

[b]Timeline[/b]  one lane per rank; a trace's lane "realN" sits under rank N
  [on #1e5aa8] F [/] forward  [on #2e8540] B [/] backward (inputs)  \
[on #b8860b] W [/] weight-grad  · idle
  ░ busy for less than half of the cell's time (zoomed out)
  a darker shade = a later chunk (virtual stage) of the rank
  "F12" = forward of microbatch 12; odd microbatches are lower case
  ("f13") so neighbours stay apart
  ←/→ previous/next op   ↑/↓ lane   +/- zoom around the cursor   0 fit
  home/end first/last op   shift+←/→ or the wheel scroll   click an op
  / find: r3 = rank 3, F12 = forward of microbatch 12, 12 = microbatch
  12, combined as "r3 b12"   n next match
  [on #6a3d9a] O [/] [on #6a3d9a] R [/] host copies of offloaded activations, in lanes
  "outN" (after the F) and "inN" (back before the B) under rank N
  [on #0b6b6b] C [/] tensor, context and expert parallel collectives inside
  each F and B, in lanes "commN" under rank N; a trace's, as its run
  timed them, in lanes "rcommN"; C hides / shows these lanes
  [on #a85a00] D [/] the step's data-parallel collectives on those lanes:
  gradient buckets beside the last backward, the parameter gather beside
  the first forward

[b]Compare[/b]  b pin the current split (b on the pinned one: even again)
  B pin a published layout or split you type (as plan --compare)
  v show the pinned split's lanes under the current ones; the panel
  lists each rank's busy time and peak memory, current minus pinned.
  With a trace of this configuration, the cursor line shows the real
  op and its difference (real - sim, as ppsim diff); a trace of another
  configuration is drawn but its figures are hidden.

[b]Memory policy[/b]  per stage, in Megatron's names; the line under the
  rows is the selected stage's, the letter after its marks says what it
  does: R recomputes modules, N its first N layers, F every layer,
  O offloads.   m / M next / previous recompute module set
  ] / \\[ block N (the first N layers recomputed whole) one more / less
  o / O next / previous offload module set
  f / F offload 25% more / less of the modules' tensors
  Changing the recompute setting puts every stage back on its mode.

[b]Planner[/b]  p plans in a child process (Esc stops it); the status
  line counts the splits evaluated. Its best split is shown beside the
  current one: a accepts it (u undoes), x dismisses it. Nudging the
  split while it runs keeps its answer; changing a setting drops it.
  P plans the split with a memory policy (per stage with one chunk per
  rank, else one Megatron-expressible policy); a, x and Esc as for p.

[b]Everywhere[/b]  u / ctrl+z undo   ctrl+y redo   ? / f1 this help
  e export the split to a file
  y copy the export   s save the config (TOML)   t load a real trace
  Escape cancels a running simulation or planner
  ctrl+p commands   q quit
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(HELP, id="help-text")

    def on_mount(self) -> None:
        box = self.query_one("#help-box")
        box.border_title = "help"
        box.border_subtitle = "Escape / q / ? close"
        box.focus()

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(None)


class ConfirmQuit(ModalScreen[str | None]):
    """Quit with unsaved edits: y quits, s saves first, n or Escape stays."""

    BINDINGS = [Binding("y,q", "answer('quit')", "Quit"), Binding("s", "answer('save')", "Save"),
                Binding("n,escape", "answer('')", "Stay")]

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Label("The split or settings changed since the last save.")
            yield Label("y quit without saving   s save first   n / Escape stay",
                        classes="dim")

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer or None)


class PathPrompt(ModalScreen[str | None]):
    """Ask for a path (or what `hint` says); Enter confirms, Escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, default: str = "", preview: str = "",
                 hint: str = "path") -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self.preview = preview
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Label(self.title_text, id="prompt-title", markup=False)
            if self.preview:
                with VerticalScroll(id="prompt-preview"):
                    yield Static(self.preview, markup=False)
            yield Input(self.default, id="prompt-input", placeholder=self.hint)
            yield Label("Enter to confirm, Escape to cancel", classes="dim")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted, "#prompt-input")
    def _submit(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class FindPrompt(PathPrompt):
    """Ask what to find in the timeline."""

    def __init__(self, default: str = "") -> None:
        super().__init__("Find in the timeline: r3 (rank), F12 / b12 (kind + microbatch), "
                         "12 (microbatch); combine, e.g. r3 b12", default,
                         hint="r3 b12, F12, 12")
