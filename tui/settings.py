"""Settings users change most: schedule, pp, vpp, microbatches, recompute, memory, presets."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Select

from ppsim.config.presets import HARDWARE_PRESETS, MODEL_PRESETS
from ppsim.schedules.generators import SCHEDULES
from ppsim.tui.messages import SettingChanged
from ppsim.tui.session import FROM_CONFIG, NO_RECOMPUTE, RECOMPUTE_MODES, EditState

INPUTS = (("pp", "pp"), ("vpp", "vpp"), ("microbatches", "microbatches"),
          ("memory_gb", "memory GB"))
"""(name, label) of the typed fields."""

SHORT_LABELS = {"schedule": "sched", "recompute": "recomp", "model": "model",
                "hardware": "hw", "pp": "pp", "vpp": "vpp", "microbatches": "m",
                "memory_gb": "mem GB"}
"""The labels in a narrow terminal (below 100 columns), whole words or plain
abbreviations, never a cut word; the help lists them."""


def select_options(config_model: bool, config_hardware: bool,
                   recompute: bool) -> dict[str, tuple[str, ...]]:
    """Each dropdown's choices; "config" (the config file's own model or hardware)
    only when the file has no preset, and recompute only for models that have it."""
    return {"schedule": tuple(SCHEDULES),
            "recompute": RECOMPUTE_MODES if recompute else (NO_RECOMPUTE,),
            "model": tuple(MODEL_PRESETS) + ((FROM_CONFIG,) if config_model else ()),
            "hardware": tuple(HARDWARE_PRESETS) + ((FROM_CONFIG,) if config_hardware else ())}


SELECTS = (("schedule", "schedule", tuple(SCHEDULES)),
           ("recompute", "recompute", RECOMPUTE_MODES),
           ("model", "model", tuple(MODEL_PRESETS)),
           ("hardware", "hardware", tuple(HARDWARE_PRESETS)))
"""(name, label, preset choices); what a dropdown offers is `select_options`."""


def field_label(name: str) -> str:
    """What the screen calls setting `name` (in messages: "memory GB", not "memory_gb")."""
    labels = {n: label for n, label in INPUTS} | {n: label for n, label, _ in SELECTS}
    return labels.get(name, name)


def state_values(state: EditState) -> dict[str, str]:
    """What each field shows for a state (exactly what is simulated)."""
    return {"pp": str(state.pp), "vpp": str(state.vpp), "microbatches": str(state.microbatches),
            "memory_gb": f"{state.memory_bytes / 1e9:g}", "schedule": state.schedule,
            "recompute": state.recompute, "model": state.model_preset or FROM_CONFIG,
            "hardware": state.hardware_preset or FROM_CONFIG}


class Settings(Vertical, can_focus=True):
    """A compact form; each change is posted as SettingChanged and checked by the app.

    A typed value takes effect on Enter or when the field loses focus; Enter also
    leaves the field (focus stays on the form, so the panel keys 1-4 work again
    instead of being typed into it); Escape puts the field back to the value being
    simulated. Refusals are said on the app's status line, never inside the form
    (a message there would grow it and push the split panel off a small screen)."""

    def __init__(self, state: EditState, config_model: bool, config_hardware: bool, *,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self._config = (config_model, config_hardware)
        self.values = state_values(state)
        self.options = select_options(*self._config, state.recompute != NO_RECOMPUTE)
        self._submitted_value: tuple[str, str] | None = None

    def compose(self) -> ComposeResult:
        for name, label, _ in SELECTS:
            with Horizontal(classes="field"):
                yield Label(label, classes="field-label", id=f"label-{name}")
                yield Select([(o, o) for o in self.options[name]], id=f"set-{name}",
                             compact=True, allow_blank=False, value=self.values[name])
        for name, label in INPUTS:
            with Horizontal(classes="field"):
                yield Label(label, classes="field-label", id=f"label-{name}")
                yield Input(id=f"set-{name}", compact=True)

    def on_resize(self) -> None:
        narrow = self.size.width < 40
        for name, label in [(n, lab) for n, lab, _ in SELECTS] + list(INPUTS):
            self.query_one(f"#label-{name}", Label).update(
                SHORT_LABELS[name] if narrow else label)

    def show_state(self, state: EditState) -> None:
        """Put a state's values in the fields (without posting changes)."""
        self.values = values = state_values(state)
        options = select_options(*self._config, state.recompute != NO_RECOMPUTE)
        for name, _, _ in SELECTS:
            sel = self.query_one(f"#set-{name}", Select)
            with sel.prevent(Select.Changed):
                if options[name] != self.options[name]:
                    sel.set_options([(o, o) for o in options[name]])
                sel.value = values[name]
            sel.disabled = len(options[name]) == 1 and name == "recompute"
        self.options = options
        for name, _ in INPUTS:
            self.revert(name)

    def revert(self, name: str) -> None:
        """Show the simulated value again in input `name`."""
        inp = self.query_one(f"#set-{name}", Input)
        with inp.prevent(Input.Changed):
            inp.value = self.values.get(name, "")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.input.id and event.input.id.startswith("set-"):
            event.stop()
            self._submitted_value = (event.input.id[4:], event.value)
            self.post_message(SettingChanged(event.input.id[4:], event.value))
            self.focus()

    @on(Input.Blurred)
    def _blurred(self, event: Input.Blurred) -> None:
        # leaving a field with a typed value applies it: a field never shows a
        # value other than the simulated one for long
        name = (event.input.id or "")[4:]
        if self._submitted_value == (name, event.value):
            return  # Enter applied it already (and left the field)
        self._submitted_value = None
        if name in self.values and event.value.strip() != self.values[name]:
            self.post_message(SettingChanged(name, event.value))

    @on(Select.Changed)
    def _selected(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id and event.value is not Select.NULL:
            self.post_message(SettingChanged(event.select.id[4:], str(event.value)))
