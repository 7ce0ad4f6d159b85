"""Comparison and navigation actions: pin a split (or a typed one), overlay its lanes,
find an op, maximise the timeline, the command palette's entries.

A mixin of `ppsim.tui.app.PPSimApp`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.app import SystemCommand
from textual.screen import Screen
from textual.widgets import Input

from ppsim.errors import UserError
from ppsim.pipeline.layout import to_layout
from ppsim.plan.references import parse_reference
from ppsim.schedules.generators import schedule_placement
from ppsim.tui.headline import Headline
from ppsim.tui.screens import FindPrompt, HelpScreen, PathPrompt
from ppsim.tui.settings import Settings
from ppsim.tui.text import counts_text
from ppsim.tui.timeline import Timeline

PANELS = ("#settings", "#split-rows", "#timeline", "#compare-box")
"""What the keys 1-4 focus (settings: its first field)."""


def pin_shape(state: Any) -> tuple:
    """What a pinned split belongs to: the state's pp, vpp and the schedule's placement
    of virtual stages on ranks (its counts mean other stages in another shape)."""
    return state.pp, state.vpp, schedule_placement(state.schedule)


def pin_examples(split: Any) -> str:
    """The `B` prompt's examples: the current split as counts and as a Megatron layout,
    so they fit the pipeline on screen (the prompt refuses another pp)."""
    counts = ",".join(str(n) for n in split.counts)
    return f"{counts} or '{to_layout(split)}'"


class ViewActions:
    """Undo/redo, help, panel keys, Escape, `b` pin, `B` pin a typed split, `v` overlay, `C`
    collectives lanes, `/` find, `n` next match, `z` maximise the timeline (mixed into the
    App)."""

    pinned: tuple[int, ...] | None
    pinned_shape: tuple | None = None
    """(pp, vpp, placement) of the state the split was pinned on."""
    show_pinned: bool
    show_collectives: bool
    find_query: str
    state: Any

    def action_undo(self) -> None:
        if self.history.undo() is not None:
            self.set_state(self.state, record=False)
        else:
            self.notify("nothing to undo")

    def action_redo(self) -> None:
        if self.history.redo() is not None:
            self.set_state(self.state, record=False)
        else:
            self.notify("nothing to redo")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_edit_count(self) -> None:
        self._show_panels()
        self.query_one("#count-input").focus()

    def action_panel(self, index: int) -> None:
        if PANELS[index] != "#timeline":
            self._show_panels()
        target = self.query_one(PANELS[index])
        if index == 0:
            target = self.query_one("#set-schedule")
        target.focus()

    def action_escape(self) -> None:
        """Leave a text field (putting back the simulated value), else cancel what runs."""
        focused = self.focused
        if isinstance(focused, Input):
            settings = self.query_one(Settings)
            name = (focused.id or "")[4:]
            typed = focused.value.strip() != settings.values.get(name, "")
            if name in settings.values:
                settings.revert(name)
            self.query_one("#split-rows").focus()
            if typed:
                return  # this Escape abandoned the typing; the next one cancels
        if self.simulating:
            self._token += 1  # its result, when it comes, is dropped
            self._child.cancel()  # a run in the child stops (ppsim.tui.child)
            self.simulating = False
            if self.result is not None:
                self.history.revert_to(self.result.state)
                self._show_state()
            self.query_one(Headline).show(self.result, "" if self.result else
                                          "simulation cancelled")
            self.say("simulation cancelled; showing the last simulated state")
        self.cancel_plan()

    def pinned_for(self, state: Any) -> tuple[int, ...] | None:
        """The pinned split when `state` has the pipeline shape it was pinned on (pp,
        vpp, the schedule's placement), else None: the even split is compared."""
        return self.pinned if self.pinned_shape == pin_shape(state) else None

    def _pin(self, counts: tuple[int, ...] | None) -> None:
        self.pinned = counts
        self.pinned_shape = pin_shape(self.state) if counts is not None else None

    def action_pin(self) -> None:
        """Pin the current split for comparison; pressed on the pinned split, go back
        to the even split."""
        if self.pinned_for(self.state) == self.state.counts:
            self._pin(None)
            self.notify("comparing with the even split")
        else:
            self._pin(self.state.counts)
            self.notify(f"pinned {list(self.state.counts)} for comparison")
        self.resimulate()

    def action_pin_typed(self) -> None:
        examples = "" if self.result is None else \
            ": " + pin_examples(self.result.sim.problem.split)
        self.push_screen(PathPrompt(
            "Pin a published layout or split to compare with (as plan --compare)"
            + examples, "",
            hint="a split or a Megatron layout"), self.pin_text)

    def pin_text(self, text: str | None) -> None:
        """Pin the split `text` names (a Megatron layout or counts), parsed as
        `ppsim plan --compare` parses it; refused in one line on the status line."""
        if not text or self.result is None:
            return
        try:
            split = parse_reference(text, self.result.sim.problem)
        except UserError as exc:
            self.say(f"pin refused: {exc.problem}; {exc.fix}" if exc.fix else
                     f"pin refused: {exc.problem}", "error")
            return
        self._pin(tuple(split.counts))
        self.say(f"pinned {counts_text(self.pinned)} for comparison")
        self.resimulate()

    def action_maximise(self) -> None:
        """The timeline alone (with its cursor line) over the whole width, or back."""
        self.screen.toggle_class("-max-timeline")
        tl = self.query_one(Timeline)
        tl.focus()
        self.call_after_refresh(tl.refit)

    def _show_panels(self) -> None:
        """Leave the full-screen timeline: a key that focuses a panel it hides would
        otherwise send the next keys to a panel the screen does not show."""
        if self.screen.has_class("-max-timeline"):
            self.action_maximise()

    def action_toggle_pinned(self) -> None:
        self.show_pinned = not self.show_pinned
        self._show_timeline(recompare=False)
        pinned = self.pinned_for(self.state)
        what = f"pinned split {counts_text(pinned)}" if pinned else "even split"
        self.notify(f"{what}'s lanes (pinN) shown under each rank" if self.show_pinned
                    else f"{what}'s lanes hidden")

    def action_toggle_collectives(self) -> None:
        """The collectives' lanes under each rank (tp / cp / ep, the step's dp), or not
        (pp 16 x tp 8: twice the lanes)."""
        self.show_collectives = not self.show_collectives
        self._show_timeline(recompare=False)
        self.notify("collectives lanes " + ("shown" if self.show_collectives else "hidden"))

    def action_find(self) -> None:
        self.push_screen(FindPrompt(self.find_query), self._find)

    def _find(self, query: str | None) -> None:
        if query:
            self.find_query = query
            self.action_find_next()

    def action_find_next(self) -> None:
        if not self.find_query:
            self.notify("nothing to find yet: / finds an op (r3, F12, r3 b12)")
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

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)  # type: ignore[misc]
        yield SystemCommand("Plan", "Run the planner; a accepts its best split, x dismisses",
                            self.action_plan)
        yield SystemCommand("Export split", "Write Megatron / torchtitan / DeepSpeed forms",
                            self.action_export)
        yield SystemCommand("Copy export", "Copy the export text to the clipboard",
                            self.action_copy_export)
        yield SystemCommand("Save config", "Write the config as TOML", self.action_save)
        yield SystemCommand("Load trace", "Compare a real trace with the simulation",
                            self.action_load_trace)
        yield SystemCommand("Pin split", "Compare later edits with the current split",
                            self.action_pin)
        yield SystemCommand("Pin a layout or split", "Type a published layout or split "
                            "to compare with (as plan --compare)", self.action_pin_typed)
        yield SystemCommand("Maximise timeline", "Give the timeline the whole screen (z)",
                            self.action_maximise)
        yield SystemCommand("Undo", "Undo the last edit", self.action_undo)
        yield SystemCommand("Redo", "Redo the last undone edit", self.action_redo)
        yield SystemCommand("Help", "Key bindings", self.action_help)
