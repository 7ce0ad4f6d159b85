"""The `ppsim tui` application: wires components, edits, workers and actions."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, ProgressBar, Static

from ppsim.config import Config, load_config
from ppsim.errors import UserError
from tui.compare import Comparison, compare
from tui.editing import EditRefused, History, click_to_boundary, move_boundary, parse_int, set_count
from tui.headline import Headline, headline_text
from tui.lanes import sim_lanes, trace_lanes
from tui.memory import MemoryBars, bars_from_summary
from tui.messages import BoundaryMove, CountSet, CursorMoved, SettingChanged, StageClick
from tui.screens import HelpScreen, PathPrompt
from tui.session import (
    EditState,
    Result,
    apply_setting,
    config_for,
    evaluate_state,
    planner_available,
    run_planner,
    state_from_config,
    state_with_split,
)
from tui.settings import Settings, state_values
from tui.split_editor import SplitEditor
from tui.timeline import Timeline


class PPSimApp(App[None]):
    CSS_PATH = "ppsim.tcss"
    TITLE = "ppsim"
    SUB_TITLE = "pipeline split editor"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark,f1", "help", "Help"),
        Binding("u,ctrl+z", "undo", "Undo"),
        Binding("ctrl+y", "redo", "Redo"),
        Binding("p", "plan", "Plan"),
        Binding("e", "export", "Export"),
        Binding("s", "save", "Save"),
        Binding("t", "load_trace", "Trace"),
        Binding("c", "edit_count", "Count", show=False),
    ]

    def __init__(self, config: Config | None = None, config_path: str | None = None,
                 trace_path: str | None = None) -> None:
        super().__init__()
        self.base = config if config is not None else load_config(config_path)
        self.config_path = config_path
        self.history: History[EditState] = History(state_from_config(self.base))
        self.result: Result | None = None
        self.trace: Any = None
        self.comparison: Comparison | None = None
        self.plan_result: Any = None
        self._initial_trace = trace_path
        self._token = 0
        self._shown: EditState | None = None
        self.results_applied = 0

    @property
    def state(self) -> EditState:
        return self.history.current

    # ------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Headline("simulating…", id="headline")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield Settings(id="settings")
                yield SplitEditor(id="split-editor")
            with Vertical(id="right"):
                yield Timeline(id="timeline")
                yield Static("", id="cursor-info")
                yield Static("", id="compare")
                yield ProgressBar(id="plan-progress", show_eta=False)
                yield MemoryBars(id="memory")
        yield Footer()

    def on_mount(self) -> None:
        self._show_state()
        self.query_one("#split-rows").focus()
        self.query_one("#split-editor").border_title = "split"
        self.query_one("#settings").border_title = "settings"
        self.query_one("#timeline").border_title = "timeline"
        self.resimulate()
        if self._initial_trace:
            self.load_trace(self._initial_trace)

    # ------------------------------------------------------------ state & simulation

    def set_state(self, state: EditState, record: bool = True) -> None:
        if record:
            self.history.push(state)
        self._show_state()
        self.resimulate()

    def _show_state(self) -> None:
        """Put the current state into the settings and the split editor (what changed)."""
        new = self.state
        if self._shown is None or state_values(self._shown) != state_values(new):
            self.query_one(Settings).show_state(new)
        if self._shown is None or self._shown.split != new.split:
            self.query_one(SplitEditor).set_split(new.split)
        self._shown = new

    def resimulate(self) -> None:
        self._token += 1
        if self.result is not None:
            self.query_one(Headline).update(headline_text(self.result, busy=True))
        self._simulate(self.state, self._token)

    @work(thread=True, exclusive=True, group="simulate")
    def _simulate(self, state: EditState, token: int) -> None:
        try:
            result = evaluate_state(self.base, state)
        except (UserError, RuntimeError) as exc:
            self.call_from_thread(self._failed, str(exc), token)
            return
        self.call_from_thread(self._apply, result, token)

    def _failed(self, message: str, token: int) -> None:
        if token == self._token:
            self.query_one(Headline).update(f"cannot simulate: {message}")

    def _apply(self, result: Result, token: int) -> None:
        if token != self._token:
            return  # a newer edit is already simulating
        self.result = result
        self.query_one(Headline).update(headline_text(result))
        self._show_timeline()
        self.query_one(MemoryBars).set_bars(bars_from_summary(result.sim.summary),
                                            result.sim.problem.hardware.memory_bytes)
        self.results_applied += 1

    def _show_timeline(self) -> None:
        if self.result is None:
            return
        lanes = sim_lanes(self.result.sim)
        if self.trace is not None:
            lanes += trace_lanes(self.trace)
            self.comparison = compare(self.result.sim, self.trace)
            box = self.query_one("#compare", Static)
            box.update("\n".join(self.comparison.lines()))
            box.add_class("-shown")
        self.query_one(Timeline).set_lanes(lanes)

    # ------------------------------------------------------------ edits

    def _edit_split(self, make: Any) -> None:
        editor = self.query_one(SplitEditor)
        try:
            counts = make(self.state.counts)
        except EditRefused as exc:
            editor.show_error(exc.reason)
            return
        editor.show_error("")
        if counts != self.state.counts:
            from dataclasses import replace

            self.set_state(replace(self.state, counts=counts))

    @on(BoundaryMove)
    def _boundary(self, event: BoundaryMove) -> None:
        self._edit_split(lambda c: move_boundary(c, event.boundary, event.delta))

    @on(StageClick)
    def _click(self, event: StageClick) -> None:
        self._edit_split(lambda c: click_to_boundary(c, event.stage, event.layer))

    @on(CountSet)
    def _count(self, event: CountSet) -> None:
        self._edit_split(lambda c: set_count(c, event.stage, parse_int("count", event.text, 0)))

    @on(SettingChanged)
    def _setting(self, event: SettingChanged) -> None:
        settings = self.query_one(Settings)
        if state_values(self.state).get(event.name) == event.text.strip():
            settings.show_error(event.name, "")
            return
        try:
            state = apply_setting(self.base, self.state, event.name, event.text)
        except EditRefused as exc:
            settings.show_error(event.name, f"{exc.field}: {exc.reason}")
            return
        settings.show_error(event.name, "")
        self.set_state(state)

    @on(CursorMoved)
    def _cursor(self, event: CursorMoved) -> None:
        tl = self.query_one(Timeline)
        self.query_one("#cursor-info", Static).update(
            f"{tl.cursor_text()} | {tl.describe_scale()}")

    # ------------------------------------------------------------ actions

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
        self.query_one("#count-input").focus()

    def action_plan(self) -> None:
        if not planner_available():
            self.notify("planner not available (ppsim.planner is missing)",
                        severity="warning")
            return
        bar = self.query_one("#plan-progress", ProgressBar)
        bar.add_class("-shown")
        bar.update(total=None, progress=0)
        self._plan(self.state)

    @work(thread=True, exclusive=True, group="plan")
    def _plan(self, state: EditState) -> None:
        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.05 or done >= total:  # at most 20 updates a second
                last[0] = now
                self.call_from_thread(self._plan_progress, done, total)

        try:
            res = run_planner(self.base, state, progress)
        except (UserError, RuntimeError) as exc:
            self.call_from_thread(self._plan_done, None, str(exc))
            return
        self.call_from_thread(self._plan_done, res, "")

    def _plan_progress(self, done: int, total: int) -> None:
        self.query_one("#plan-progress", ProgressBar).update(total=total, progress=done)

    def _plan_done(self, res: Any, error: str) -> None:
        self.query_one("#plan-progress", ProgressBar).remove_class("-shown")
        self.plan_result = res
        if res is None or res.best is None:
            self.notify(error or "the planner found no split that fits memory",
                        severity="error")
            return
        self.set_state(state_with_split(self.state, res.best.split))
        proof = "proven optimal" if res.proven_optimal else "best found"
        self.notify(f"planner: {list(res.best.split.counts)} "
                    f"{res.best.summary.iteration_time_ms:.3f} ms ({proof}; "
                    f"{res.evaluated}/{res.total_splits} splits evaluated)")

    def action_export(self) -> None:
        from tui.exports import export_text

        try:
            preview = export_text(self.state.split)
        except UserError as exc:
            self.notify(f"cannot export: {exc}", severity="error")
            return
        self.push_screen(PathPrompt("Export the split to", "ppsim-split.sh", preview),
                         self.export_to)

    def export_to(self, path: str | None) -> None:
        from tui.exports import write_export

        if not path:
            return
        try:
            write_export(path, self.state.split, self._title())
        except (UserError, OSError) as exc:
            self.notify(f"cannot export: {exc}", severity="error")
            return
        self.notify(f"split exported to {path}")

    def action_save(self) -> None:
        self.push_screen(PathPrompt("Save the config (TOML) to",
                                    self.config_path or "ppsim.toml"), self.save_to)

    def save_to(self, path: str | None) -> None:
        from tui.exports import save_config

        if not path:
            return
        try:
            save_config(path, config_for(self.base, self.state))
        except OSError as exc:
            self.notify(f"cannot save: {exc}", severity="error")
            return
        self.config_path = path
        self.notify(f"config saved to {path}")

    def action_load_trace(self) -> None:
        self.push_screen(PathPrompt("Load a trace (Chrome JSON from ppsim run / simulate)"),
                         self.load_trace)

    def load_trace(self, path: str | None) -> None:
        from ppsim.trace import read_trace

        if not path:
            return
        try:
            self.trace = read_trace(path)
        except UserError as exc:
            self.notify(str(exc), severity="error")
            box = self.query_one("#compare", Static)
            box.update(f"cannot load trace: {exc}")
            box.add_class("-shown")
            return
        self._show_timeline()

    def _title(self) -> str:
        s = self.state
        return f"{s.model_preset or 'model'} {s.schedule} microbatches={s.microbatches}"

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Plan", "Run the planner and jump to its best split", self.action_plan)
        yield SystemCommand("Export split", "Write Megatron / torchtitan / DeepSpeed forms",
                            self.action_export)
        yield SystemCommand("Save config", "Write the config as TOML", self.action_save)
        yield SystemCommand("Load trace", "Compare a real trace with the simulation",
                            self.action_load_trace)
        yield SystemCommand("Undo", "Undo the last edit", self.action_undo)
        yield SystemCommand("Redo", "Redo the last undone edit", self.action_redo)
        yield SystemCommand("Help", "Key bindings", self.action_help)
