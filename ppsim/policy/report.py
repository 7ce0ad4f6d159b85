"""A problem's memory policy as JSON: one entry per virtual stage."""

from __future__ import annotations

from typing import Any

from ppsim.pipeline.problem import Problem
from ppsim.policy.costs import Fixed


def stage_policies(problem: Problem) -> list[dict[str, Any]]:
    """`{stage, recompute_modules, recompute_layers, offload_modules, offload_fraction}`
    per virtual stage of the problem's split (N capped at the stage's layers)."""
    memory = problem.memory
    split = problem.split
    out = []
    for st in split.stages:
        p = memory.policy_of(st.offset, st.layers, st.index, st.has_embedding, st.has_head,
                             False)
        out.append(p.to_dict(st.index, st.layers))
    return out


def policy_json(problem: Problem) -> dict[str, Any]:
    """{"policy": [...]} when the problem runs a memory policy, else {}."""
    if not isinstance(problem.memory, Fixed):
        return {}
    return {"policy": stage_policies(problem)}
