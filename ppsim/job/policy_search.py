"""The memory policy of a job's shapes, for `plan --gpus N --search recompute|policy`.

Recompute adds only backward time, so for a shape timed with its default split the
fastest global mode that fits is the first of none, selective, full whose peak fits
memory: the search times each shape at none first, and `fitting_mode` tries the others
in that order. For the fastest shapes, `best_policy` then plans the split together with
the memory policy as `plan --search policy` does for one shape (ppsim.policy.search: the
global modes and the Megatron-expressible space), within the shape's share of the budget.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from ppsim.config.overrides import with_overrides
from ppsim.job.layers import per_rank_arch
from ppsim.pipeline.problem import Problem, build_problem, model_costs
from ppsim.policy.megatron import policy_export
from ppsim.policy.model import mode_ladder, shorthand
from ppsim.policy.report import policy_flags
from ppsim.policy.search import SpaceBest, plan_global, plan_megatron, space_key
from ppsim.policy.setup import policy_costs
from ppsim.sim.simulate import simulate
from ppsim.sim.summary import Summary

POLICY_AXES = ("recompute", "policy")
"""What `plan --gpus --search` takes: recompute (the global modes on every shape) and
policy (those, then the Megatron-expressible policy planned for the fastest shapes)."""


@dataclass(frozen=True, kw_only=True)
class ModeFit:
    """A shape timed at a stronger global recompute mode."""

    mode: str
    problem: Problem
    summary: Summary


def mode_flags(problem: Problem, mode: str) -> str | None:
    """Megatron's flags for a global recompute mode ("" for none; None for torchtitan's
    SelectiveAC, which Megatron has not). Selective is the granularity alone: Megatron's
    default module list is core_attn, and a hybrid stack takes no module list."""
    if mode == "selective":
        return "--recompute-granularity selective"
    job = problem.hardware.job
    assert job is not None  # a job's shape is a transformer model's
    export = policy_export((shorthand(mode),), per_rank_arch(job.arch))
    return None if export.megatron_flags is None else shlex.join(export.megatron_flags)


def fitting_mode(cfg: Any) -> ModeFit | None:
    """The first global mode after the configured one under which the shape's default
    split fits memory; None when none does. `cfg` is the shape's config (no [memory])."""
    ladder = mode_ladder(cfg.model.arch)
    configured = cfg.model.recompute or "none"
    # a mode of another framework's (Megatron's selective on a torchtitan job): the
    # ladder's stronger modes
    start = ladder.index(configured) if configured in ladder else 0
    # Megatron's combined 1F1B refuses full recompute (ppsim.job.combined).
    modes = ladder[:2] if cfg.pipeline.overlap_moe_expert_parallel_comm else ladder
    for mode in modes[start + 1:]:
        c = with_overrides(cfg, model={"recompute": mode})
        problem = build_problem(c, model_costs(c))
        summary = simulate(problem, record=False).summary
        if summary.fits:
            return ModeFit(mode=mode, problem=problem, summary=summary)
    return None


@dataclass(frozen=True, kw_only=True)
class PolicyPlan:
    """A shape's split and memory policy planned together."""

    label: str
    """The policy in words: "full", "layernorm N=2", ..."""
    problem: Problem
    """The shape with the planned split and the policy's costs."""
    summary: Summary
    megatron_flags: str | None
    """Megatron's flags for the policy; None when Megatron cannot say it."""


def best_policy(cfg: Any, budget_s: float) -> PolicyPlan | None:
    """The fastest of the global modes and of the Megatron-expressible space for the
    shape `cfg` (its memory policy as configured is the search's start, not a limit);
    a torchtitan job's, of torchtitan's modes alone (it runs one activation-checkpoint
    policy for every block). None when nothing fits."""
    base = with_overrides(cfg, model={"recompute": "none"})
    problem = build_problem(base)
    pc = policy_costs(base)
    torchtitan = cfg.model.arch.torchtitan_fsdp
    # the configured job's ladder: `base` says none, which would drop op-sac from it
    glob = plan_global(problem, pc, budget_s * (0.9 if torchtitan else 0.3),
                       mode_ladder(cfg.model.arch))
    best: SpaceBest = glob
    if not torchtitan:
        seeds = [problem.split.counts] + ([glob.result.best.split.counts]
                                          if glob.result and glob.result.best else [])
        best = min((glob, plan_megatron(problem, pc, budget_s * 0.6, seeds)), key=space_key)
    r = best.result
    if r is None or r.best is None:
        return None
    planned = r.problem.with_split(r.best.split)
    export = policy_flags(planned, best.policies)
    flags = None if export.megatron_flags is None else shlex.join(export.megatron_flags)
    label = best.label  # the Megatron space writes "-" for no recompute modules
    if label == "-":
        label = "none"
    elif label.startswith("- "):
        label = "no recompute, " + label[2:]
    return PolicyPlan(label=label, problem=planned, summary=r.best.summary,
                      megatron_flags=flags)
