"""The planner as an app action: a child process watched by a worker thread, with
progress; Escape stops it; its answer is applied only when the state it planned is
still the current one.

The planners (`p` the split's, `P` the memory policy's, ppsim.tui.policy_actions) run
in their own process (`ppsim.tui.plan_child`) because they are pure Python: in a thread
they would take the GIL from the screen, and a thread cannot be stopped.
`IN_PROCESS = False` runs them in the worker thread instead (tests that replace a
planner with a stand-in use it).

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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from textual import work
from textual.widgets import Static

from ppsim.errors import UserError
from ppsim.plan.advice import no_fit_message
from ppsim.plan.planner import count_splits
from ppsim.tui.policy_plan import policy_summary
from ppsim.tui.session import (
    EditState,
    planner_available,
    run_planner,
    state_with_split,
)
from ppsim.tui.text import counts_text, thousands

IN_PROCESS = True
DROPPED = ("planner proposal dropped: the settings or the policy changed since it was "
           "made (p plans the current state)")


def total_splits(state: EditState) -> int:
    """How many splits the planner may evaluate (what the status line counts against)."""
    return count_splits(state.num_layers, state.pp * state.vpp)


def start_child(job: tuple) -> subprocess.Popen:
    """Start `python -P -m ppsim.tui.plan_child` on this process's import path (not the
    working directory's, unless that is on it); send the job (see plan_child)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-P", "-m", "ppsim.tui.plan_child"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None
    pickle.dump(job, proc.stdin)
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


def child_answer(job: tuple, cancel: threading.Event,
                 progress: Callable[[int, int], None]) -> tuple | None:
    """Run `job` in the planner process: its progress to `progress`, then its answer,
    ("done", result) or ("error", text); None once `cancel` is set (the process is
    killed then, as when it answered)."""
    proc = start_child(job)
    try:
        while not cancel.is_set():
            msg = read_message(proc, 0.05)
            if msg is None:
                if proc.poll() is not None:
                    return "error", "the planner stopped without an answer"
            elif msg[0] == "progress":
                progress(msg[1], msg[2])
            else:
                return msg
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


class PlanCancelled(Exception):
    """Raised from the planner's progress callback to stop it."""


def same_but_split(started: EditState, current: EditState) -> bool:
    """True when `current` differs from the state the planner started from only in
    its split (which the planner's answer replaces anyway)."""
    return replace(started, counts=current.counts) == current


def progress_text(evaluated: int, total: int) -> str:
    """The status line while the planner runs: a real count of splits evaluated."""
    of = f" of {thousands(total)} possible" if total > 0 else ""
    return f"planner: {thousands(evaluated)} splits evaluated{of}… (Esc stops it)"


def outcome_text(res: Any, current_ms: float | None) -> str:
    """The planner's best as the status line says it: split, time, how sure, what
    it costs against the current split, and the keys that accept or dismiss it."""
    best = res.best
    t = best.summary.iteration_time_ms
    proof = "proven optimal" if res.proven_optimal else "best found in the budget"
    vs = f" {current_ms / t:.3f}x vs current," if current_ms and t > 0 else ""
    return (f"planner: {counts_text(best.split.counts, 30)} {t:.3f} ms,{vs} a accepts, "
            f"x dismisses ({proof}; {thousands(res.evaluated)} of "
            f"{thousands(res.total_splits)} splits evaluated)")


class PlannerActions:
    """`p` runs the planner; its best is a proposal shown beside the current split,
    `a` accepts it, `x` dismisses it (mixed into the App)."""

    planning: threading.Event | None
    plan_result: Any
    proposal: Any
    proposal_for: EditState | None = None
    """The state the proposal was made for: it stands while only the split changes."""
    planning_name = "planner"
    """What runs under `planning` (Escape's message names it)."""

    def propose(self, proposal: EditState) -> None:
        """Show `proposal` (a planner's answer for the current state) beside the split."""
        self.proposal, self.proposal_for = proposal, self.state
        self._show_proposal()

    def live_proposal(self) -> EditState | None:
        """The proposal while the settings and policies are those it was made for (the
        split may differ: the proposal replaces it), else None (and it is dropped)."""
        made_for = self.proposal_for
        if self.proposal is not None and (made_for is None
                                          or not same_but_split(made_for, self.state)):
            self.proposal = None
            self.say(DROPPED, "warning")
        return self.proposal

    def action_plan(self) -> None:
        if not planner_available():
            self.notify("planner not available (ppsim.planner is missing)",
                        severity="warning")
            return
        if self.planning is not None:
            self.notify("the planner is running (Esc cancels it)")
            return
        self.say(progress_text(0, total_splits(self.state)))
        self.planning, self.planning_name = threading.Event(), "planner"
        self._plan(self.state, self.planning)

    def cancel_plan(self) -> None:
        """Escape: the running planner's process is killed, its answer dropped, and `p` /
        `P` start again at once (a stand-in planner's thread ends unseen)."""
        if self.planning is not None:
            self.planning.set()
            self.planning = None
            self.notify(f"{self.planning_name} cancelled")

    @work(thread=True, group="plan")
    def _plan(self, state: EditState, cancel: threading.Event) -> None:
        if not IN_PROCESS:
            self._plan_here(state, cancel)
            return
        outcome = child_answer(("split", self.base, state), cancel,
                               lambda done, total: self.call_from_thread(
                                   self._plan_progress, done, total))
        if outcome is None:
            return  # Escape said so (cancel_plan)
        res, error = (outcome[1], "") if outcome[0] == "done" else (None, outcome[1])
        self.call_from_thread(self._plan_done, res, error, state, cancel)

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
            return  # Escape said so (cancel_plan)
        except UserError as exc:
            self.call_from_thread(self._plan_done, None, str(exc), state, cancel)
            return
        self.call_from_thread(self._plan_done, res, "", state, cancel)

    def _plan_progress(self, done: int, total: int) -> None:
        if self.planning is not None:
            self.say(progress_text(done, total or total_splits(self.state)))

    def _plan_done(self, res: Any, error: str, started: EditState,
                   cancel: threading.Event) -> None:
        if cancel.is_set():
            return  # Escape dropped it (cancel_plan); another planner may run now
        self.planning = None
        self.plan_result = res
        if res is not None and res.best is None:
            self.notify(no_fit_message(res), severity="error")  # stays on the status line
            return
        if res is None:
            self.say(f"planner: {error}", "error")
            return
        if not same_but_split(started, self.state):
            self.notify("planner result dropped: the settings changed while it ran "
                        "(press p to plan the current state)", severity="warning")
            return
        current = self.result.sim.summary.iteration_time_ms if self.result else None
        self.say(outcome_text(res, current))
        self.propose(state_with_split(self.state, res.best.split))

    def _show_proposal(self) -> None:
        """The planner's best beside the current (and pinned) split, until accepted or
        dismissed; gone when the shape changed (it no longer fits)."""
        box = self.query_one("#proposal", Static)
        prop = self.live_proposal()
        res = self.plan_result
        if prop is None or res is None or res.best is None:
            box.update("")
            box.remove_class("-shown")
            return
        t = res.best.summary.iteration_time_ms
        cur = self.result.sim.summary.iteration_time_ms if self.result else t
        width = max(20, self.query_one("#compare-box").scrollable_content_region.width - 2)
        policy = f"\npolicy {policy_summary(prop, width - 7)}" \
            if prop.policies and prop.policies != self.state.policies else ""
        timing = f"{t:.3f} ms ({t - cur:+.3f} ms vs current)"
        head = f"planner {counts_text(prop.counts, width - 30)}"
        if len(head) + 1 + len(timing) <= width:
            head += " " + timing
        else:  # 80 columns, a long iteration: the split and its timing on lines of their own
            head = f"planner {counts_text(prop.counts, width - 8)}\n{timing}"
        box.update(f"{head}{policy}\na accept · x dismiss")
        box.add_class("-shown")

    def action_accept_plan(self) -> None:
        had = self.proposal is not None
        if self.live_proposal() is None:
            self._show_proposal()
            if not had:
                self.notify("no planner proposal (p runs the planner)")
            return
        state, self.proposal = self.proposal, None
        self.set_state(state, field="split")
        self.say(f"planner's split accepted: {counts_text(state.counts)} (u undoes)")

    def action_dismiss_plan(self) -> None:
        if self.proposal is None:
            self.notify("no planner proposal to dismiss (p runs the planner)")
            return
        self.proposal = None
        self._show_proposal()
        self.say("planner proposal dismissed")
