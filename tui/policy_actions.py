"""The memory-policy keys as app actions: the split editor's policy knobs and `P`,
the policy planner, run in the planner process as `p` is (a mixin of
`ppsim.tui.app.PPSimApp`, which holds `state`, `set_state`, `result`, `planning`,
`proposal` and `plan_result`)."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from textual import work

from ppsim.costs.op_sac import OP_SAC
from ppsim.errors import UserError
from ppsim.plan.advice import no_fit_message
from ppsim.policy.model import MODES
from ppsim.policy.search import SpaceBest
from ppsim.tui import planning
from ppsim.tui.editing import EditRefused
from ppsim.tui.messages import PolicyKey
from ppsim.tui.planning import child_answer, same_but_split
from ppsim.tui.policy_edit import (
    OP_SAC_REFUSAL,
    choices_for,
    edit_policy,
    stage_policies,
    with_stage,
)
from ppsim.tui.policy_plan import BUDGET_S, outcome_text, plan_policy, proposed_state
from ppsim.tui.session import EditState


def current_policies(state: EditState) -> tuple:
    """What the split editor shows for a state: one policy per virtual stage, or ()
    for a model without a recompute setting (uniform costs: no policy) or on
    torchtitan's SelectiveAC (one policy for every block)."""
    if state.recompute not in MODES:
        return ()
    return stage_policies(state.policies, state.recompute, state.pp * state.vpp)


def policy_refusal(state: EditState, has_choices: bool) -> str | None:
    """Why the policy keys cannot edit this state's per-stage policy; None where they can."""
    if state.recompute == OP_SAC:
        return f"memory policy refused: {OP_SAC_REFUSAL}"
    if not has_choices or not current_policies(state):
        return ("memory policy refused: this model has uniform costs (no op lists); "
                "choose a transformer model")
    return None


class PolicyActions:
    """Policy keys of the split editor (m M [ ] o O f F) and `P` (mixed into the App)."""

    planning: threading.Event | None
    planning_name: str
    plan_result: Any
    proposal: Any

    def on_policy_key(self, event: PolicyKey) -> None:
        event.stop()
        s = self.state
        choices = choices_for(self.result.config.model) if self.result is not None else None
        refusal = policy_refusal(s, choices is not None)
        if refusal is not None:
            self.notify(refusal, severity="error")
            return
        policies = current_policies(s)
        st = s.split.stages[event.stage]
        try:
            new = edit_policy(policies[event.stage], event.knob, event.step, st.layers,
                              *choices)
        except EditRefused as exc:
            self.notify(f"{exc.field} refused: {exc.reason}", severity="error")
            return
        self.set_state(replace(s, policies=with_stage(policies, event.stage, new)),
                       field="policy")

    def action_plan_policy(self) -> None:
        if self.planning is not None:
            self.notify("the planner is running (Esc cancels it)")
            return
        self.say(f"policy planner: split x memory policy, up to {BUDGET_S:g} s… (Esc stops it)")
        self.planning, self.planning_name = threading.Event(), "policy planner"
        self._plan_policy(self.state, self.planning)

    @work(thread=True, group="plan")
    def _plan_policy(self, state: EditState, cancel: threading.Event) -> None:
        """The search in the planner process (Escape kills it); a stand-in planner
        (planning.IN_PROCESS False) in this thread."""
        if planning.IN_PROCESS:
            outcome = child_answer(("policy", self.base, state, BUDGET_S), cancel,
                                   lambda done, total: None)  # it reports no progress
            if outcome is None:
                return  # Escape said so (cancel_plan)
            best, error = (outcome[1], "") if outcome[0] == "done" else (None, outcome[1])
        else:
            try:
                best, error = plan_policy(self.base, state, BUDGET_S), ""
            except UserError as exc:
                best, error = None, str(exc)
        self.call_from_thread(self._policy_done, best, error, state, cancel)

    def _policy_done(self, best: SpaceBest | None, error: str, started: EditState,
                     cancel: threading.Event) -> None:
        if cancel.is_set():
            return  # Escape dropped it (cancel_plan); another planner may run now
        self.planning = None
        if best is None or best.result is None:
            self.say(f"policy planner: {error or best.label}", "error")  # type: ignore
            return
        prop = proposed_state(self.state, best)
        if prop is None:
            self.notify(no_fit_message(best.result), severity="error")
            return
        if not same_but_split(started, self.state):
            self.notify("policy plan dropped: the settings or the policy changed while it "
                        "ran (press P to plan the current state)", severity="warning")
            return
        self.plan_result = best.result
        current = self.result.sim.summary.iteration_time_ms if self.result else None
        self.say(outcome_text(best, prop, current))
        self.propose(prop)  # type: ignore[attr-defined]
