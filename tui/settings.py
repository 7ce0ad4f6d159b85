"""Settings users change most: schedule, pp, vpp, microbatches, recompute, memory, presets."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Select

from ppsim.presets import HARDWARE_PRESETS, MODEL_PRESETS
from ppsim.schedules import SCHEDULES
from tui.messages import SettingChanged
from tui.session import RECOMPUTE_MODES, EditState

INPUTS = (("pp", "pp"), ("vpp", "vpp"), ("microbatches", "microbatches"),
          ("memory_gb", "memory GB"))
SELECTS = (("schedule", "schedule", tuple(SCHEDULES)),
           ("recompute", "recompute", RECOMPUTE_MODES),
           ("model", "model", tuple(MODEL_PRESETS)),
           ("hardware", "hardware", tuple(HARDWARE_PRESETS)))


def state_values(state: EditState) -> dict[str, str]:
    """What each field shows for a state."""
    return {"pp": str(state.pp), "vpp": str(state.vpp), "microbatches": str(state.microbatches),
            "memory_gb": f"{state.memory_bytes / 1e9:g}", "schedule": state.schedule,
            "recompute": state.recompute, "model": state.model_preset or "",
            "hardware": state.hardware_preset or ""}


class Settings(Vertical):
    """A compact form; each change is posted as SettingChanged and checked by the app."""

    def compose(self) -> ComposeResult:
        for name, label, options in SELECTS:
            with Horizontal(classes="field"):
                yield Label(label, classes="field-label")
                yield Select([(o, o) for o in options], id=f"set-{name}", compact=True,
                             allow_blank=True, prompt="(custom)")
        for name, label in INPUTS:
            with Horizontal(classes="field"):
                yield Label(label, classes="field-label")
                yield Input(id=f"set-{name}", compact=True)
        yield Label("", id="settings-error", classes="error")

    def show_state(self, state: EditState) -> None:
        """Put a state's values in the fields (without posting changes)."""
        values = state_values(state)
        for name, _, options in SELECTS:
            sel = self.query_one(f"#set-{name}", Select)
            v = values[name]
            with sel.prevent(Select.Changed):
                if v in options:
                    sel.value = v
                else:
                    sel.clear()
        for name, _ in INPUTS:
            inp = self.query_one(f"#set-{name}", Input)
            with inp.prevent(Input.Changed):
                inp.value = values[name]
            inp.remove_class("-invalid")

    def show_error(self, field: str, text: str) -> None:
        label = self.query_one("#settings-error", Label)
        label.update(text)
        label.set_class(bool(text), "-shown")
        for name, _ in INPUTS:
            self.query_one(f"#set-{name}", Input).set_class(bool(text) and name == field,
                                                            "-invalid")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.input.id and event.input.id.startswith("set-"):
            event.stop()
            self.post_message(SettingChanged(event.input.id[4:], event.value))

    @on(Select.Changed)
    def _selected(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id and event.value is not Select.NULL:
            self.post_message(SettingChanged(event.select.id[4:], str(event.value)))
