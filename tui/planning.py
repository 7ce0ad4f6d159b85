"""The planner as an app action: a worker thread with progress, Escape cancels it, and
its answer is applied only when the state it planned is still the current one.

A mixin of `tui.app.PPSimApp` (which holds `state`, `set_state` and `planning`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from textual import work
from textual.widgets import ProgressBar

from ppsim.errors import UserError
from tui.session import EditState, planner_available, run_planner, state_with_split


class PlanCancelled(Exception):
    """Raised from the planner's progress callback to stop it."""


class PlannerActions:
    """`p` runs the planner (mixed into the App)."""

    planning: threading.Event | None
    plan_result: Any

    def action_plan(self) -> None:
        if not planner_available():
            self.notify("planner not available (ppsim.planner is missing)",
                        severity="warning")
            return
        if self.planning is not None:
            self.notify("the planner is running (Esc cancels it)")
            return
        bar = self.query_one("#plan-progress", ProgressBar)
        bar.add_class("-shown")
        bar.update(total=None, progress=0)
        self.planning = threading.Event()
        self._plan(self.state, self.planning)

    @work(thread=True, group="plan")
    def _plan(self, state: EditState, cancel: threading.Event) -> None:
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if cancel.is_set():
                raise PlanCancelled
            now = time.monotonic()
            if now - last[0] >= 0.05 or done >= total:  # at most 20 updates a second
                last[0] = now
                self.call_from_thread(self._plan_progress, done, total)

        try:
            res = run_planner(self.base, state, progress)
        except PlanCancelled:
            self.call_from_thread(self._plan_done, None, "planner cancelled", state)
            return
        except UserError as exc:
            self.call_from_thread(self._plan_done, None, str(exc), state)
            return
        self.call_from_thread(self._plan_done, res, "", state)

    def _plan_progress(self, done: int, total: int) -> None:
        self.query_one("#plan-progress", ProgressBar).update(total=total or None,
                                                             progress=done)

    def _plan_done(self, res: Any, error: str, started: EditState) -> None:
        self.query_one("#plan-progress", ProgressBar).remove_class("-shown")
        self.planning = None
        self.plan_result = res
        if error == "planner cancelled":
            self.notify(error)
            return
        if res is None or res.best is None:
            self.notify(error or "the planner found no split that fits memory",
                        severity="error")
            return
        if started != self.state:
            self.notify("planner result dropped: the settings changed while it ran "
                        "(press p to plan the current state)", severity="warning")
            return
        self.set_state(state_with_split(self.state, res.best.split), field="split")
        proof = "proven optimal" if res.proven_optimal else "best found"
        self.notify(f"planner: {list(res.best.split.counts)} "
                    f"{res.best.summary.iteration_time_ms:.3f} ms ({proof}; "
                    f"{res.evaluated}/{res.total_splits} splits evaluated)")
