"""The planner as an app action: a child process watched by a worker thread, with
progress; Escape stops it; its answer is applied only when the state it planned is
still the current one.

The planner runs in its own process (`ppsim.tui.plan_child`) because it is pure Python: in a
thread it
would take the GIL from the screen, and a thread cannot be stopped.
`IN_PROCESS = False` runs `run_planner` in the worker thread instead (tests that
replace the planner with a stand-in use it).

A mixin of `ppsim.tui.app.PPSimApp` (which holds `state`, `set_state` and `planning`).
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import threading
import time
from typing import Any

from textual import work
from textual.widgets import ProgressBar

from ppsim.errors import UserError
from ppsim.tui.session import (
    EditState,
    planner_available,
    run_planner,
    state_with_split,
)

IN_PROCESS = True


def start_child(base: Any, state: EditState) -> subprocess.Popen:
    """Start `python -P -m ppsim.tui.plan_child` on this process's import path (not the
    working directory's, unless that is on it); send the job."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-P", "-m", "ppsim.tui.plan_child"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None
    pickle.dump((base, state), proc.stdin)
    proc.stdin.close()
    return proc


def read_message(proc: subprocess.Popen, timeout: float) -> tuple | None:
    """The child's next message, or None when none arrived within `timeout` (or at EOF)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return None
    try:
        return pickle.load(proc.stdout)  # the child flushes whole messages
    except EOFError:
        return None


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
        self.notify("planner running: the bar shows splits evaluated; Esc cancels")
        self.planning = threading.Event()
        self._plan(self.state, self.planning)

    @work(thread=True, group="plan")
    def _plan(self, state: EditState, cancel: threading.Event) -> None:
        if not IN_PROCESS:
            self._plan_here(state, cancel)
            return
        outcome: tuple = ("error", "the planner stopped without an answer")
        proc = start_child(self.base, state)
        try:
            while not cancel.is_set():
                msg = read_message(proc, 0.05)
                if msg is None:
                    if proc.poll() is not None:
                        break
                    continue
                if msg[0] == "progress":
                    self.call_from_thread(self._plan_progress, msg[1], msg[2])
                else:
                    outcome = msg
                    break
            else:
                outcome = ("error", "planner cancelled")
        finally:
            if proc.poll() is None:
                proc.kill()  # cancelled or done: the child stops here
            proc.wait(5)
        res, error = (outcome[1], "") if outcome[0] == "done" else (None, outcome[1])
        self.call_from_thread(self._plan_done, res, error, state)

    def _plan_here(self, state: EditState, cancel: threading.Event) -> None:
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
