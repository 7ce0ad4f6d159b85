"""`ppsim plan --gpus N --global-batch-size B`: the job's shape searched with its split.

Every shape Megatron accepts on N GPUs is a candidate: tp a power of two within a node
dividing the query groups, cp with 2 x cp dividing the sequence (up to 8, and beyond
while each rank keeps 8,192 tokens), pp any size up to 64 (dividing the layers or not:
Megatron splits unevenly too), vpp 1, 2, 4 or 8,
micro-batch 1, 2 or 4, ep (MoE only) dividing the experts with etp (tp, or 1 at tp > 1:
MoE parallel folding) x ep dividing tp x cp x dp; dp is N / (tp x cp x pp) and the
microbatches B / (mbs x dp), refused when they do not divide as Megatron refuses them
(any count under 1F1B, at least pp interleaved; torch's own rules for a torchtitan job).
Each shape is simulated with its default split, unless no split could hold its weights
and optimizer state, or those with its activations (ppsim.job.walk); the TOP_SEARCHED
fastest that fit (at least), and any faster that does not fit at its default split, then
have their split planned (ppsim.plan.planner), and with what the budget leaves, long
shots: shapes an uneven split might make faster than the best planned (ppsim.job.choice).
Each candidate says what held it back most: memory, the pipeline bubble, or
communication the compute did not hide.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from ppsim.config.overrides import with_overrides
from ppsim.errors import UserError
from ppsim.job.choice import launch_order, long_shots, shapes_to_plan, tie_key
from ppsim.job.pending import (
    Pending,
    host_refusal,
    host_variants,
    pending_shape,
    shape_config,
)
from ppsim.job.policy_search import best_policy
from ppsim.job.pricing import Priced, price_shapes
from ppsim.job.shapes import (
    Shape,
    cp_comm_choices,
    dispatcher_choices,
    held_batch_refusal,
    microbatch_refusal,
    shapes,
    sharding_choices,
)
from ppsim.job.walk import (
    Progress,
    ShapeResult,
    bounded_out_shots,
    shape_result,
    silent,
    simulate_shapes,
)
from ppsim.plan.planner import plan
from ppsim.schedules.generators import schedule_for_vpp, schedule_refusal
from ppsim.sim.simulate import simulate
from ppsim.sim.summary import Summary

SPLIT_SHARE = 1 / 12
"""The most of the budget one shape's split plan takes (5 s of the default 60)."""
PRICING_SHARE = 0.5
"""The most of the budget pricing the shapes takes (ppsim.job.pricing); the walk and the
split plans have the rest."""
HOSTING_SHARE = 0.3
"""The most of the budget trying overflowing shapes with the optimizer on the host takes
(after pricing)."""
LONG_SHOT = 0.25
"""The share of SPLIT_SHARE a shape gets whose default split does not fit."""
SHOTS_SPARE = 0.1
"""The share of the budget long shots leave unspent: they plan with what the top shapes
left, and a search that plans them still ends well within its budget."""
TOP_SEARCHED = 5
"""The fewest fastest shapes (tie groups: ppsim.job.choice) the search plans
the splits of, whatever the table's --top: the best does not depend on how many rows are
shown."""
JOB_AXES = ("sharding", "dispatcher", "cp-comm", "host-optimizer")
"""--search axes of the job search alone (beside the memory policy's)."""

@dataclass(frozen=True, kw_only=True)
class JobSearch:
    """What `search_job` found."""

    candidates: list[ShapeResult]
    """Fitting shapes fastest first, then those that do not fit."""
    evaluated: int
    """Shapes simulated (those whose static bytes alone overflow memory are not)."""
    total: int
    """Shapes the model, the world and the batch allow (the budget may stop short)."""
    complete: bool = True
    """Every shape was priced, then simulated or bounded out (with its default split), within
    the budget."""
    overflowing: int = 0
    """Shapes whose weights, gradients and optimizer states alone overflow memory."""
    over_floor: int = 0
    """Shapes not simulated because, with the activations each rank holds at once under
    its schedule, no split fits memory (ppsim.plan.floor; not under a memory policy
    search, which may recompute them)."""
    refused: int = 0
    """Shapes the model refuses (Megatron's checks, e.g. heads that tp does not divide)."""
    seconds: float
    long_shots: int = 0
    """Shapes planned as long shots (those the budget left no time for are not)."""
    long_shots_unplanned: int = 0
    """Long shots chosen that the budget left no time to plan (a longer one may find a
    faster shape among them)."""
    budget_s: float = 60.0
    """The time budget the search ran under."""
    leanest: Pending | None = None
    """When every shape's weights, gradients and optimizer states alone overflow memory:
    the shape that needs the least of them (None otherwise)."""

    @property
    def unsimulated(self) -> int:
        """Shapes neither simulated nor set aside for memory or a refusal: bounded out
        where the search is complete, else not reached when the budget ran out."""
        return self.total - self.evaluated - self.overflowing - self.refused - self.over_floor


def _faster(found: Summary, r: ShapeResult) -> bool:
    return found.fits and (not r.summary.fits or found.iteration_time_ms
                           < r.summary.iteration_time_ms)


def _refined(r: ShapeResult, cfg: Any, policy: str, budget_s: float) -> ShapeResult:
    """The shape's split planned (with the memory policy, when searched): the fastest
    that fits, where the default split does not; `r` itself when nothing faster fits."""
    if policy == "policy":
        found = best_policy(cfg, budget_s)
        if found is not None and _faster(found.summary, r):
            return shape_result(r.shape, found.problem, found.summary, planned=True,
                                policy=found.label, policy_flags=found.megatron_flags)
        return r
    res = plan(r.problem, top_k=1, time_budget_s=budget_s)
    if res.best is not None and _faster(res.best.summary, r):
        best = shape_result(r.shape, r.problem.with_split(res.best.split), res.best.summary,
                            planned=True, policy=r.policy, policy_flags=r.policy_flags)
        return replace(best, split_proven=res.proven_optimal)
    # Nothing faster fits: a finished search proves the default split the fastest.
    return replace(r, split_proven=res.proven_optimal)


def _fastest_first(results: list[ShapeResult]) -> list[ShapeResult]:
    return sorted(results, key=lambda r: (not r.summary.fits, *launch_order(r)))


def _candidates(cfg: Any, gpus: int, gbs: int, fixed: dict[str, int] | None,
                axes: frozenset[str]) -> list[Shape]:
    """The shapes to time: every one the model, world and batch allow, under each
    sharding, dispatcher and context-parallel traffic when those are searched (`axes`,
    JOB_AXES); UserError when there is none."""
    a = cfg.model.arch
    combined = cfg.pipeline.overlap_moe_expert_parallel_comm
    per_node = cfg.hardware.gpus_per_node
    sharding = "sharding" in axes
    if a.megatron_fsdp2 and not sharding:  # Megatron refuses it with pp or ep
        fixed = {**(fixed or {}), "pp": 1, "ep": 1}
    schedule = cfg.pipeline.schedule
    todo = shapes(a, gpus, gbs, per_node, cfg.model.total_layers, fixed, sharding, combined,
                  cfg.pipeline.overlap_param_gather_with_optimizer_step, schedule)
    # A --schedule given: the shapes it runs (V: two chunks; DualPipeV: m >= 2pp).
    refusals = [schedule_refusal(schedule_for_vpp(cfg.pipeline.schedule, s.vpp), s.pp, s.vpp,
                                 s.microbatches) for s in todo]
    if todo and all(refusals):
        raise refusals[0]  # in the schedule's own words
    todo = [s for s, no in zip(todo, refusals, strict=True) if no is None]
    if sharding:
        # each sharding's framework (Megatron or torchtitan) runs its own microbatch counts
        todo = [v for s in todo
                for v in sharding_choices(s, per_node, a.num_experts > 0, combined,
                                          a.fsdp_framework)
                if microbatch_refusal(a, v, schedule) is None]
    if "dispatcher" in axes:
        if not a.num_experts:
            raise UserError("--search", "dispatcher: the model has no routed experts",
                            "drop dispatcher from --search, or plan a MoE model")
        todo = [v for s in todo for v in dispatcher_choices(s)]
    if "cp-comm" in axes:
        todo = [v for s in todo for v in cp_comm_choices(s, a, per_node)]
    if "host-optimizer" in axes:
        host_refusal(cfg)
    if not todo and fixed:
        given = ", ".join(f"{k} {v}" for k, v in fixed.items())
        _refuse_held_microbatches(cfg, gpus, gbs, fixed, sharding, given)
        batch = held_batch_refusal(a, gpus, gbs, per_node, cfg.model.total_layers, fixed,
                                   any_copies=sharding, combined=combined,
                                   interleaved=cfg.pipeline.overlap_param_gather_with_optimizer_step)
        if batch is not None:
            raise batch  # in Megatron's words, as `simulate` refuses the shape
        raise UserError("--gpus", f"no shape of {gpus:,} GPUs at a global batch of {gbs:,} "
                        f"has {given} (the model, the world or the batch refuses it)",
                        "fix fewer sizes, or sizes that divide the world and the batch")
    if not todo:
        raise UserError("--global-batch-size", f"no shape of {gpus:,} GPUs divides a global "
                        f"batch of {gbs:,}", "give a batch that is a multiple of the "
                        "data-parallel sizes, e.g. a power of two")
    return todo


def _refuse_held_microbatches(cfg: Any, gpus: int, gbs: int, fixed: dict[str, int],
                              sharding: bool, given: str) -> None:
    """UserError naming the schedule's rule where shapes with the held sizes exist but
    their framework runs none of their microbatch counts (interleaving at m < pp)."""
    a, p = cfg.model.arch, cfg.pipeline
    loose = shapes(a, gpus, gbs, cfg.hardware.gpus_per_node, cfg.model.total_layers, fixed,
                   sharding, p.overlap_moe_expert_parallel_comm,
                   p.overlap_param_gather_with_optimizer_step, schedule=None)
    refused = [(s, why) for s in loose
               if (why := microbatch_refusal(a, s, p.schedule, sharding)) is not None]
    if refused:
        s, why = max(refused, key=lambda r: r[0].microbatches)  # the nearest to running
        raise UserError("--global-batch-size", f"no shape of {gpus:,} GPUs at a global "
                        f"batch of {gbs:,} with {given} runs its microbatches "
                        f"({s.label()}: {why})", "give a larger global batch, or hold "
                        "fewer sizes" + (" (without --vpp: 1F1B)" if s.vpp > 1 else ""))


@dataclass(frozen=True, kw_only=True)
class Hosted:
    """The overflowing shapes tried with part of their optimizer on the host."""

    found: list[Pending]
    """Those that fit so (host_variants)."""
    complete: bool
    """Every overflowing shape was tried before the deadline."""


def _on_the_host(cfg: Any, accepted: list[Pending | Priced], gbs: int, progress: Progress,
                 deadline: float) -> Hosted:
    """Each shape whose weights and optimizer state alone overflow memory, with the least
    share of its optimizer on the host that lets them fit and with all of it (where that
    fits: ppsim.job.pending.host_variants), leanest first until `deadline`
    (perf_counter seconds)."""
    over = sorted((p for p in accepted if p.overflows), key=lambda p: p.static_bytes)
    found = []
    for i, p in enumerate(over):
        if time.perf_counter() > deadline:
            return Hosted(found=found, complete=False)
        progress("putting the optimizer on the host", i, len(over))
        found += host_variants(cfg, p.shape, gbs)
    return Hosted(found=found, complete=True)


def _ties(policy: str) -> bool:
    """Shapes tied at their default split share a plan, except under a memory policy
    search, which plans each shape's policy on its own."""
    return policy != "policy"


def _plan_splits(cfg: Any, chosen: list[ShapeResult], gbs: int, policy: str, budget_s: float,
                 t0: float, progress: Progress, what: str = "planning the top shapes' splits",
                 as_long_shots: bool = False) -> list[ShapeResult]:
    """The chosen shapes with their splits planned, each within an equal share of what is
    left of the budget that began at `t0`, at most SPLIT_SHARE of it (LONG_SHOT of that
    for a shape that does not fit at its default split, and for every one of
    `as_long_shots`); a longer budget gives each split more time."""
    refined = []
    n = len(chosen)
    # A tie's first shape is planned; the others take its split (with a policy search,
    # each is planned).
    keys = [tie_key(r) if _ties(policy) else i for i, r in enumerate(chosen)]
    planned: dict[Any, ShapeResult] = {}
    for i, r in enumerate(chosen):
        progress(what, i, n)
        first = planned.get(keys[i])
        if first is not None:
            refined.append(replace(_with_split_of(r, first), long_shot=first.long_shot))
            continue
        left = budget_s * (1.0 - SHOTS_SPARE * as_long_shots) - (time.perf_counter() - t0)
        most = budget_s * SPLIT_SHARE * (1.0 if r.summary.fits and not as_long_shots
                                         else LONG_SHOT)
        share = min(most, left / len(set(keys[i:]) - set(planned)))
        out = r if left <= 1.0 else _refined(r, shape_config(cfg, r.shape, gbs), policy, share)
        if as_long_shots and left > 1.0:
            out = replace(out, long_shot=True)
        planned[keys[i]] = out
        refined.append(out)
    return refined


def _with_split_of(r: ShapeResult, first: ShapeResult) -> ShapeResult:
    """`r` at the split planned for `first`, a shape tied with it at their default
    splits (the same work a rank), simulated: where it is faster, planned but not proven
    (the planner ran on `first`)."""
    split = first.problem.split
    if not first.planned or split.num_stages != r.problem.split.num_stages:
        return r
    problem = r.problem.with_split(split)
    summary = simulate(problem, record=False).summary
    if not _faster(summary, r):
        return r
    return shape_result(r.shape, problem, summary, planned=True, policy=r.policy,
                        policy_flags=r.policy_flags)


def _check_search(cfg: Any, axes: frozenset[str]) -> None:
    """A job search needs a transformer model and knows only JOB_AXES."""
    if getattr(cfg.model, "arch", None) is None:
        raise UserError("--gpus", "plans the job of a transformer model", "give --preset NAME")
    unknown = sorted(axes - set(JOB_AXES))
    if unknown:
        raise ValueError(f"unknown job search axes {unknown}")


def search_job(cfg: Any, gpus: int, gbs: int, top_k: int = 5,
               budget_s: float = 60.0, policy: str = "",
               fixed: dict[str, int] | None = None,
               progress: Progress = silent,
               axes: frozenset[str] = frozenset(), shots: bool = True) -> JobSearch:
    """Shapes of `gpus` GPUs for a global batch of `gbs`, fastest first; `policy`
    (ppsim.job.policy_search.POLICY_AXES) searches the memory policy too, `axes`
    (JOB_AXES) the replicas' sharding (sharding_choices), the MoE token dispatcher
    (dispatcher_choices), context parallelism's traffic (cp_comm_choices) and the
    optimizer on the host for shapes that overflow without it (_on_the_host); `fixed`
    holds some sizes (FIXABLE) where the user set them; `progress` is told each step;
    `shots`: plan long shots after the top shapes (ppsim.job.choice.long_shots)."""
    t0 = time.perf_counter()
    _check_search(cfg, axes)
    if policy:  # every shape from the lightest mode: recompute only adds time
        cfg = with_overrides(cfg, model={"recompute": "none"})
    todo = _candidates(cfg, gpus, gbs, fixed, axes)
    # Cheapest bound first: a shape whose default split's busiest rank alone is slower than
    # the k-th fastest fitting default split cannot enter the top k at its default split
    # (k at least TOP_SEARCHED, so a shorter table lists the same best).
    k = max(top_k, TOP_SEARCHED)
    pricing = price_shapes(cfg, todo, gbs, progress, deadline=t0 + budget_s * PRICING_SHARE)
    accepted: list[Pending | Priced] = list(pricing.priced)
    refusals = pricing.refusals
    # from where pricing ended: a pricing that took its whole share leaves hosting its own
    hosting_ends = time.perf_counter() + budget_s * HOSTING_SHARE
    hosted = _on_the_host(cfg, accepted, gbs, progress, hosting_ends) \
        if "host-optimizer" in axes else Hosted(found=[], complete=True)
    accepted += hosted.found
    if not accepted:
        _refuse_nothing_built(pricing.complete, refusals, len(todo), budget_s, gpus, gbs)
    pending = sorted((p for p in accepted if not p.overflows), key=lambda p: p.bound_ms)
    leanest = min(accepted, key=lambda p: p.static_bytes)
    walked = simulate_shapes(pending, lambda p: _whole(cfg, p, gbs), policy, k, budget_s,
                             t0, progress)
    results = walked.results
    complete = pricing.complete and hosted.complete and walked.complete
    ties = _ties(policy)
    chosen = shapes_to_plan(results, k, ties=ties)
    refined = _plan_splits(cfg, chosen, gbs, policy, budget_s, t0, progress)
    best = min((r.summary.iteration_time_ms for r in refined if r.summary.fits),
               default=float("inf"))
    if shots:
        results += bounded_out_shots(pending[walked.reached:], lambda p: _whole(cfg, p, gbs),
                                     best, k, policy, ties,
                                     t0 + budget_s * (1.0 - SHOTS_SPARE - SPLIT_SHARE),
                                     progress)
    extra = long_shots(results, chosen, best, k, ties=ties) if shots else []
    shot = _plan_splits(cfg, extra, gbs, policy, budget_s, t0, progress,
                        "planning long shots' splits", as_long_shots=True)
    refined += shot
    chosen += extra
    rest = [r for r in results if all(r is not c for c in chosen)]
    return JobSearch(candidates=_fastest_first(refined + rest),
                     evaluated=len(results), total=len(todo) + len(hosted.found),
                     overflowing=len(accepted) - len(pending), refused=len(refusals),
                     over_floor=walked.over_floor,
                     seconds=time.perf_counter() - t0, complete=complete,
                     long_shots=sum(r.long_shot for r in refined),
                     long_shots_unplanned=sum(not r.long_shot for r in shot),
                     budget_s=budget_s,
                     leanest=None if pending else _whole(cfg, leanest, gbs))


def _refuse_nothing_built(complete: bool, refusals: list[UserError], shapes: int,
                          budget_s: float, gpus: int, gbs: int) -> None:
    """No shape could be built: the budget ran out among refusals, or every one refused."""
    if not complete:
        raise UserError("--time-budget", f"{budget_s:g} s priced {len(refusals):,} of "
                        f"{shapes:,} shapes, and the model refuses each",
                        f"give it more time, e.g. --time-budget {longer_budget(budget_s):g}")
    fields = {r.field for r in refusals}
    if len(fields) == 1 and fields.pop().startswith("model."):
        raise refusals[0]  # one model setting refuses every shape: in the model's words
    raise UserError("--global-batch-size", f"no shape of {gpus:,} GPUs at a global batch "
                    f"of {gbs:,} can be built; the first refused says {refusals[0]}")


def longer_budget(budget_s: float) -> float:
    """The --time-budget to suggest where `budget_s` ran out before the search did."""
    return max(10.0, 4 * budget_s)


def _whole(cfg: Any, p: Pending | Priced, gbs: int) -> Pending:
    """`p` with its config and costs (priced apart, a shape has neither)."""
    return p if isinstance(p, Pending) else pending_shape(cfg, p.shape, gbs)
