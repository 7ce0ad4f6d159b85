"""The `ppsim tui` application: wires components, edits, workers and actions.

Every simulation and planner run happens in a worker thread, tagged with the
generation (`_token`) of the state it was started for; a result whose
generation is no longer current is dropped, so the screen never shows numbers
for a state other than the one in the widgets. Escape cancels what runs.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import replace
from functools import partial
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Header, Static

from ppsim.config.schema import Config, load_config
from ppsim.errors import UserError
from ppsim.tui.bindings import APP_BINDINGS
from ppsim.tui.child import (
    ChildCancelled,
    ChildRefused,
    PinnedCache,
    child_for,
    evaluate_anywhere,
    uses_child,
)
from ppsim.tui.comm_lanes import comm_lanes, trace_comm_lanes
from ppsim.tui.compare import CompareBox, Comparison, compare, delta_lines, needs_records, op_delta
from ppsim.tui.copy_lanes import copy_lanes
from ppsim.tui.editing import (
    EditRefused,
    History,
    click_to_boundary,
    move_boundary,
    parse_int,
    set_count,
)
from ppsim.tui.files import FileActions
from ppsim.tui.footer import KeyFooter
from ppsim.tui.headline import Headline, over_limit
from ppsim.tui.lanes import interleave, pinned_lanes, sim_lanes, trace_lanes
from ppsim.tui.memory import MemoryBars, bars_from_summary
from ppsim.tui.messages import BoundaryMove, CountSet, CursorMoved, SettingChanged, StageClick
from ppsim.tui.planning import PlannerActions
from ppsim.tui.policy_actions import PolicyActions, current_policies
from ppsim.tui.session import (
    EditState,
    Result,
    apply_setting,
    state_from_config,
)
from ppsim.tui.settings import Settings, field_label, state_values
from ppsim.tui.split_editor import SplitEditor
from ppsim.tui.status import StatusLine
from ppsim.tui.timeline import Timeline
from ppsim.tui.views import ViewActions
from ppsim.tui.warning_bar import WarningBar

HINT = "? help · 1-4 panels · z timeline full screen · p plan · B pin a typed layout"
"""What the status line says until the first message."""


class PPSimApp(FileActions, PlannerActions, PolicyActions, ViewActions, App[None]):
    CSS_PATH = "ppsim.tcss"
    TITLE = "ppsim"
    SUB_TITLE = "pipeline split editor"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    BINDINGS = APP_BINDINGS

    def __init__(self, config: Config | None = None, config_path: str | None = None,
                 trace_path: str | None = None, note: str = "", unsaved: bool = False,
                 inputs: dict[str, str | None] | None = None) -> None:
        super().__init__()
        self.input_files = dict(inputs or {})
        """The other files the command line read (--hardware, --deepspeed-config, ...):
        a save or an export never replaces one."""
        self.base = config if config is not None else load_config(config_path)
        self.config_path = config_path
        self.history: History[EditState] = History(state_from_config(self.base))
        self.saved_state = None if unsaved else self.history.current  # unsaved: re-split
        self.result: Result | None = None
        self.trace: Any = None
        self._trace_lanes: tuple[Any, list] = (None, [])
        self._under: list = []
        """The lanes drawn under their rank's (ppsim.tui.child.Evaluation.under_lanes)."""
        self._lanes: tuple = ([], [])
        self.comparison: Comparison | None = None
        self.plan_result: Any = None
        self.proposal: EditState | None = None
        self.pinned: tuple[int, ...] | None = None
        self.show_pinned = False
        self.show_collectives = True
        self.simulating = False
        self.planning: threading.Event | None = None
        self.find_query = ""
        self._initial_trace = trace_path
        self._note = note
        self._token = 0
        self._sim_running = False
        self._edit_field = ""
        self._shown: EditState | None = None
        self.results_applied = 0
        self._child = child_for(self)

    def _handle_exception(self, error: Exception) -> None:
        """A user error that escapes (a trace or config the checks did not catch) ends
        the app with exit status 2 and its one line (ppsim.cli.tui prints it); anything else
        is a crash: Textual's traceback and exit status 1."""
        cause = getattr(error, "error", None) if type(error).__name__ == "WorkerFailed" \
            else error
        if isinstance(cause, UserError):
            if self._exception is None:
                self._exception = cause
                self._exception_event.set()
            self._return_code = 2
            self.exit(return_code=2)
            return
        super()._handle_exception(error)

    def notify(self, message: str, **kwargs: Any) -> None:  # type: ignore[override]
        """Notifications carry paths and typed text: never read them as markup. The
        toast shows the whole message for a while; the status line keeps it (cut to
        one line) until the next one."""
        kwargs.setdefault("markup", False)
        super().notify(message, **kwargs)
        # and on the status line, where it stays after the toast is gone
        self.say(message, str(kwargs.get("severity", "information")))

    @property
    def state(self) -> EditState:
        return self.history.current

    # ------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Headline("simulating…", id="headline")
        yield WarningBar(id="warnings")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield Settings(self.state, self.base.model.preset is None,
                               self.base.hardware.preset is None, id="settings")
                yield SplitEditor(id="split-editor")
            with Vertical(id="right"):
                yield Timeline(id="timeline")
                yield Static("", id="cursor-info", markup=False)
                with CompareBox(id="compare-box", can_focus=True):
                    yield Static("", id="proposal", markup=False)  # first: in view
                    yield Static("", id="compare", markup=False)
                    yield Static("", id="deltas", markup=False)
                    yield MemoryBars(id="memory")
        yield StatusLine(id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self._show_state()
        self.query_one("#split-rows").focus()
        for panel, title in (("#settings", "1 settings"), ("#split-editor", "2 split"),
                             ("#timeline", "3 timeline"), ("#compare-box", "4 compare")):
            self.query_one(panel).border_title = title
        self.query_one("#compare-box").border_subtitle = "b pin split · v overlay"
        self.resimulate()
        self.say(HINT)
        if self._note:
            self.notify(self._note, severity="warning", timeout=8)
        if self._initial_trace:
            self.load_trace(self._initial_trace)

    # ------------------------------------------------------------ state & simulation

    def set_state(self, state: EditState, record: bool = True, field: str = "") -> None:
        status = self.query_one(StatusLine)
        if status.message.severity == "error":
            status.say("")  # an accepted edit: the last refusal no longer applies
        if record:
            self.history.push(state)
        self._edit_field = field
        self._show_state()
        self.resimulate()

    def _show_state(self) -> None:
        """Put the current state into the settings and the split editor (what changed)."""
        new = self.state
        if self._shown is None or state_values(self._shown) != state_values(new):
            self.query_one(Settings).show_state(new)
        if self._shown is None or (self._shown.split, self._shown.policies) != (
                new.split, new.policies):
            self._show_split()
        self._shown = new

    def _show_split(self) -> None:
        over: frozenset[int] = frozenset()
        kinds: tuple[str, ...] = ()
        if self.result is not None and self.result.state == self.state:
            summary = self.result.sim.summary
            over = frozenset(r for r, _ in over_limit(
                summary, self.result.sim.problem.hardware.memory_bytes))
            kinds = tuple(getattr(self.result.sim.problem.costs, "kinds", ()) or ())
        self.query_one(SplitEditor).set_split(self.state.split, over, kinds,
                                              current_policies(self.state))

    def resimulate(self) -> None:
        self._token += 1
        self.simulating = True
        s = self.state
        busy = (f"simulating pp {s.pp} x {s.microbatches} microbatches… (Esc cancels; "
                f"numbers below are the previous state's)")
        self.query_one(Headline).show(self.result, busy)
        if self._sim_running:  # a stale run in the child stops; the newest state goes next
            self._child.cancel()
        else:  # one simulation at a time
            self._sim_running = True
            run = partial(self._simulate, self.state, self.pinned_for(self.state),
                          self._token, self._edit_field)
            if uses_child(s):
                # a run of about a second or more: let the screen draw the new state
                # first (starting the child's job competes with that frame)
                self.call_after_refresh(run)
            else:
                run()

    def _sim_finished(self, token: int) -> bool:
        """A worker ended: True when its result is for the current state; otherwise
        start the current state's simulation if one is still wanted."""
        self._sim_running = False
        if token == self._token:
            self.simulating = False
            return True
        if self.simulating:
            self._sim_running = True
            self._simulate(self.state, self.pinned_for(self.state), self._token,
                           self._edit_field)
        return False

    @work(thread=True, group="simulate")
    def _simulate(self, state: EditState, pinned: Any, token: int, field: str) -> None:
        # lanes and the trace comparison grow with the run: built off the UI thread, a
        # large state in the child process (ppsim.tui.child says why)
        trace = self.trace
        pin = self._lanes  # the pinned split's simulation is cached: so are its lanes
        cache = PinnedCache(sim=pin[3], lanes=pin[2]) if len(pin) > 2 else None
        try:
            ev = evaluate_anywhere(self._child, self.base, state, pinned, trace, cache)
        except (UserError, EditRefused, ChildRefused) as exc:
            self.call_from_thread(self._refused, str(exc), token, field)
            return
        except ChildCancelled:  # a newer state, or Escape: its answer is not wanted
            self.call_from_thread(self._sim_finished, token)
            return
        self.call_from_thread(self._apply, ev.result, token,
                              (ev.lanes, ev.pinned_lanes, trace, ev.comparison, ev.under_lanes))

    def _refused(self, message: str, token: int, field: str) -> None:
        """The core refused the state: go back to the last simulated one, say why."""
        if not self._sim_finished(token):
            return
        if self.result is None:
            self.query_one(Headline).show(None, f"cannot simulate: {message}")
            self.say(f"cannot simulate: {message}", "error")
            return
        text = f"{field_label(field or 'edit')} refused, kept the previous state: {message}"
        self.history.revert_to(self.result.state)
        self._show_state()
        self.notify(text, severity="error")
        self.query_one(Headline).show(self.result)

    def say(self, text: str, severity: str = "information") -> None:
        """Put a message on the status line, where it stays until the next one."""
        self.query_one(StatusLine).say(text, severity)

    def _apply(self, result: Result, token: int, views: tuple = ()) -> None:
        if not self._sim_finished(token):
            return  # a newer edit is simulating (or this one was cancelled)
        self.result = result
        self._lanes = views[:2] if views else (sim_lanes(result.sim),
                                               pinned_lanes(result.pinned))
        self._lanes += (self._lanes[1], result.pinned)
        self._under = views[4] if views else copy_lanes(result.sim) + comm_lanes(result.sim)
        recompare = not views or views[2] is not self.trace
        if not recompare:
            self.comparison = views[3]
        self.query_one(Headline).show(result)
        self.query_one(WarningBar).show(result.warnings)
        self._show_split()
        self._show_timeline(recompare)
        self.query_one(MemoryBars).set_bars(bars_from_summary(result.sim.summary),
                                            result.sim.problem.hardware.memory_bytes)
        self._show_deltas()
        self.results_applied += 1
        gc.freeze()  # see collection_paused

    def _show_deltas(self) -> None:
        """The compare panel's lines (and the planner's proposal) worded for its width."""
        if self.result is None:
            return
        box = self.query_one("#compare-box")
        if box.scrollable_content_region.width <= 0:  # not laid out yet
            self.call_after_refresh(self._show_deltas)
        width = max(20, box.scrollable_content_region.width - 2)
        self.query_one("#deltas", Static).update("\n".join(delta_lines(self.result, width)))
        self._show_proposal()

    def on_compare_box_resized(self) -> None:
        self._show_deltas()  # worded for the panel's new width

    def _show_timeline(self, recompare: bool = True) -> None:
        """Lanes (real ones under their rank) and the trace comparison; `recompare`
        when the comparison was not made with this result (a trace just loaded)."""
        if self.result is None:
            return
        sim_l, pin_l = self._lanes[:2]
        others = [pin_l] if self.show_pinned else []
        box = self.query_one("#compare", Static)
        if self.trace is not None:
            if self._trace_lanes[0] is not self.trace:  # its ops, then what they waited on
                self._trace_lanes = (self.trace, trace_lanes(self.trace)
                                     + trace_comm_lanes(self.trace))
            others.append(self._trace_lanes[1])
            if (recompare or self.comparison is None) and needs_records(self.result.sim,
                                                                        self.trace):
                self.resimulate()  # simulated in the child, without records: compared there
                return
            if recompare or self.comparison is None:
                self.comparison = compare(self.result.sim, self.trace)
            box.update("\n".join(self.comparison.lines()))
            box.add_class("-shown")
            self.say_trace()
        # the host copies of an offloading policy and the tp / cp / ep collectives inside
        # the ops, under their rank (built with the simulation: ppsim.tui.child); a
        # trace's collectives under its lanes; `C` hides them all
        lanes = interleave(sim_l, self._under, *others)
        self.query_one(Timeline).set_lanes([lane for lane in lanes if self.show_collectives
                                            or lane.source != "comm"])

    # ------------------------------------------------------------ edits

    def _edit_split(self, make: Any) -> None:
        try:
            counts = make(self.state.counts)
        except EditRefused as exc:
            self.notify(f"{field_label(exc.field)} refused: {exc.reason}", severity="error")
            return
        if counts != self.state.counts:
            self.set_state(replace(self.state, counts=counts), field="split")

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
            return
        try:
            state = apply_setting(self.base, self.state, event.name, event.text)
        except EditRefused as exc:
            # a refused value never stays in its field: the field shows what is simulated
            settings.revert(event.name)
            self.notify(f"{field_label(event.name)} {event.text.strip()!r} refused, kept "
                        f"{settings.values.get(event.name)}: {exc.reason}", severity="error")
            return
        self.set_state(state, field=event.name)

    @on(CursorMoved)
    def _cursor(self, event: CursorMoved) -> None:
        tl = self.query_one(Timeline)
        tl.border_subtitle = tl.describe_scale()  # on the border: never cut at 80 columns
        text = f"{tl.cursor_text()} | {tl.describe_scale()}"
        op = tl.current_op()
        if op is not None and tl.lanes[event.lane].source == "sim":
            real = [lane for lane in tl.lanes if lane.source == "real"
                    and lane.rank == tl.lanes[event.lane].rank]
            shown = self.comparison is not None and not self.comparison.hidden
            delta = op_delta(op, real[0].ops) if real and shown else ""
            if delta:
                text += f"\n{delta}"
        self.query_one("#cursor-info", Static).update(text)

    # ------------------------------------------------------------ actions

