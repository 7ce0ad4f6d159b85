"""The planner's memory-policy search for the TUI's current state (no Textual here).

`P` plans the split and the memory policy together, as `ppsim plan --search
policy-per-stage` does: for one chunk per rank each stage its cheapest policy that
fits (ppsim.policy.search.plan_per_stage); with chunks the Megatron-expressible
space's best split, each rank's chunks then given their fastest fitting policy
(refine_per_rank). The answer is a proposal: an
EditState with the planner's split and per-stage policies, accepted or dismissed
like the split planner's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ppsim.config.overrides import with_overrides
from ppsim.config.schema import Config
from ppsim.costs.op_sac import OP_SAC
from ppsim.errors import UserError
from ppsim.pipeline.problem import build_problem
from ppsim.policy.search import SpaceBest, plan_megatron, plan_per_stage, refine_per_rank
from ppsim.policy.setup import policy_costs
from ppsim.tui.policy_edit import OP_SAC_REFUSAL
from ppsim.tui.session import EditState, config_for, state_with_split
from ppsim.tui.text import counts_text

BUDGET_S = 5.0
"""Seconds the policy planner may take (in its own process, ppsim.tui.plan_child)."""


def plan_policy(base: Config, state: EditState, budget_s: float = BUDGET_S) -> SpaceBest:
    """The best split with its memory policy for the state's shape (UserError for a
    model without op lists): per stage with one chunk per rank, else the
    Megatron-expressible space seeded with the current and the even split, refined
    per rank. Refused on op-sac: the proposal would put Megatron's per-stage policies
    on torchtitan's SelectiveAC, which takes none."""
    if state.recompute == OP_SAC:
        raise UserError("recompute", OP_SAC_REFUSAL)
    cfg = with_overrides(config_for(base, replace(state, policies=())), split={})
    problem = build_problem(cfg)
    pc = policy_costs(cfg)
    if problem.split.vpp == 1:
        return plan_per_stage(problem, pc, budget_s)
    seeds = list(dict.fromkeys([tuple(state.counts), tuple(problem.split.counts)]))
    return refine_per_rank(problem, pc, plan_megatron(problem, pc, budget_s, seeds))


def policy_in_child(base: Config, state: EditState, budget_s: float, conn: Any) -> None:
    """`plan_policy` in the planner process (ppsim.tui.plan_child): ("done", SpaceBest)
    or ("error", text) on the pipe."""
    try:
        conn.send(("done", plan_policy(base, state, budget_s)))
    except UserError as exc:
        conn.send(("error", str(exc)))


def proposed_state(state: EditState, best: SpaceBest) -> EditState | None:
    """The state the planner proposes: its split and one policy per virtual stage
    (None when it found nothing that fits)."""
    r = best.result
    if r is None or r.best is None or len(best.policies) != r.best.split.num_stages:
        return None
    return replace(state_with_split(state, r.best.split), policies=tuple(best.policies))


def policy_summary(state: EditState, width: int) -> str:
    """The proposed policies, runs of stages with the same one together:
    "s0-1 layernorm,mlp; s2-7 none" (ppsim.policy.model.StagePolicy.label, N capped at
    each stage's layers), cut to `width`."""
    runs: list[list] = []
    for st in state.split.stages:
        p = state.policies[st.index]
        text = replace(p, recompute_layers=min(p.recompute_layers, st.layers)).label()
        if runs and runs[-1][2] == text:
            runs[-1][1] = st.index
        else:
            runs.append([st.index, st.index, text])
    line = "; ".join((f"s{a}" if a == b else f"s{a}-{b}") + f" {t}" for a, b, t in runs)
    return line if len(line) <= width else line[:max(1, width - 1)] + "…"


def outcome_text(best: SpaceBest, state: EditState, current_ms: float | None) -> str:
    """The status line's words for the policy planner's answer."""
    r = best.result
    assert r is not None and r.best is not None
    t = r.best.summary.iteration_time_ms
    vs = f" {current_ms / t:.3f}x vs current," if current_ms and t > 0 else ""
    how = "proven optimal" if best.proven else (best.copies or "best found in the budget")
    return (f"policy planner ({best.space}): {counts_text(state.counts, 30)} {t:.3f} ms,{vs} "
            f"a accepts, x dismisses ({how})")
