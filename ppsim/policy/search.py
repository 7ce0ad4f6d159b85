"""The split and the memory policy searched together, in three spaces.

- global: one of the modes none / selective / full for every stage;
- Megatron-expressible: one recompute module set and one block count N for every
  stage, offload with one fraction;
- per stage: each virtual stage its own module set, N and offload.

Each point of the first two is a fixed policy the split planner (ppsim.plan.planner)
searches exactly. Per stage, with one chunk per rank, a stage's memory depends on
its own layers only, so the planner prices each candidate stage at the cheapest
policy of `groups` that keeps its rank within memory (ppsim.policy.costs.Cheapest):
recompute adds only backward time (and the per-stage space offloads only where the
host link hides the copies, which then add none), the simulated iteration never
shrinks when an op grows, so this choice is optimal for each split and the split
search stays exact (tests/property/test_policy_search.py checks it against brute
force).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ppsim.costs.kinds import kind_effect
from ppsim.costs.model import StageCost
from ppsim.costs.modules import applies
from ppsim.pipeline.problem import Problem
from ppsim.plan.planner import PlanResult, plan
from ppsim.plan.search import SplitSearch
from ppsim.policy.costs import Cheapest, Fixed, PolicyCosts
from ppsim.policy.megatron import offload_refusal, recompute_refusal
from ppsim.policy.model import ALL_LAYERS, StagePolicy, mode_ladder, shorthand
from ppsim.policy.report import host_fits
from ppsim.sim.copies import estimated
from ppsim.sim.simulate import simulate

MODULE_SETS = (
    (), ("core_attn",), ("layernorm",), ("layernorm", "mlp"), ("layernorm", "moe_act"),
    ("layernorm", "moe_act", "shared_experts"), ("layernorm", "moe"),
    ("layernorm", "mla_up_proj"), ("layernorm", "moe_act", "mla_up_proj"),
)
"""Recompute module sets the search tries (those that differ for the model)."""
OFFLOAD_SETS = (("core_attn", "attn_proj"),
                ("core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"))
"""Offload module sets the search tries when the hardware has a host link (core_attn with
attn_proj: attention's output, which both save, leaves the device only with both, and is
copied once either way)."""
FRACTIONS = (0.5, 1.0)
"""Offload fractions the search tries."""


def module_groups(pc: PolicyCosts, offload: bool) -> list[StagePolicy]:
    """Distinct, undominated policies with N = 0: each saves more bytes per layer than
    every cheaper one (a policy that costs more and saves less is never chosen)."""
    kinds = sorted(set(pc.kinds) - {"mtp"}) or ["dense"]
    seen: dict[tuple[int, float], StagePolicy] = {}
    for mods in MODULE_SETS:
        if any(not any(applies(m, pc.arch, k) for k in kinds) for m in mods):
            continue  # a module the model does not have: the same as a smaller set
        if pc.combined and "moe" in mods:
            continue  # Megatron's combined 1F1B refuses it
        if recompute_refusal(mods, pc.arch, pc.shared_overlap):
            continue  # nor does Megatron take it for this model
        var = pc.layers_under(mods)
        saved = sum(kind_effect(pc.arch, k, ()).kept_bytes
                    - kind_effect(pc.arch, k, mods).kept_bytes for k in kinds)
        extra = sum(var.layers[pc.kinds.index(k)].backward_ms
                    - pc.base.layers[pc.kinds.index(k)].backward_ms for k in kinds)
        seen.setdefault((saved, round(extra, 9)), StagePolicy(recompute_modules=mods))
    ranked = sorted(seen.items(), key=lambda kv: (kv[0][1], -kv[0][0]))
    out, most = [], -1
    for (saved, _), p in ranked:
        if saved > most:
            out.append(p)
            most = saved
    if offload:
        sets = {tuple(m for m in o if any(applies(m, pc.arch, k) for k in kinds))
                for o in OFFLOAD_SETS}
        out += [replace(p, offload_modules=o, offload_fraction=f)
                for p in list(out) for o in sorted(sets) for f in FRACTIONS
                if not offload_refusal(p.recompute_modules, o)
                and any(kind_effect(pc.arch, k, p.recompute_modules, o).offloaded_bytes
                        for k in kinds)]
    return out


@dataclass(frozen=True, kw_only=True)
class SpaceBest:
    """The best plan found in one space."""

    space: str
    """"global", "megatron" or "per-stage"."""
    result: PlanResult | None
    """The plan of the best point (None: nothing planned in time)."""
    policies: tuple[StagePolicy, ...] = ()
    """The best plan's policy per virtual stage."""
    label: str = ""
    """The point, in words ("selective", "layernorm N=2", ...)."""
    proven: bool = False
    """Every point of the space was planned to optimality."""
    copies: str = ""
    """How its offload copies were timed: "" (none offloaded), or RESIMULATED."""


RESIMULATED = ("planned with the per-stage estimate of the host copies, timed by the "
               "simulator's copy streams")
"""What a space's figures are when its policy offloads: the planner's leaves price each
copy per stage (ppsim.sim.copies.estimated, not a bound), so the reported plan is
simulated again with the copy streams and no optimality is claimed for it."""


def best_problem(sb: SpaceBest) -> Problem:
    """The space's best split with its policy per stage, as the simulator runs it."""
    r = sb.result
    assert r is not None and r.best is not None and r.problem.memory is not None
    return replace(r.problem.with_split(r.best.split),
                   memory=Fixed(costs=r.problem.memory.costs, policies=sb.policies))


def resimulated(sb: SpaceBest) -> SpaceBest:
    """The space's best timed by the simulator's copy streams when its policy offloads."""
    r = sb.result
    if r is None or r.best is None or not any(p.offloads for p in sb.policies):
        return sb
    summary = simulate(best_problem(sb), record=False).summary
    best = replace(r.best, summary=summary)
    return replace(sb, result=replace(r, best=best, candidates=[best]), proven=False,
                   copies=RESIMULATED)


def _fixed(problem: Problem, pc: PolicyCosts, policies: tuple[StagePolicy, ...]) -> Problem:
    return replace(problem, costs=pc.base, memory=Fixed(costs=pc, policies=policies))


def space_key(sb: SpaceBest) -> tuple[float, bool, int]:
    """(iteration ms, offloads, peak bytes) of a space's best; inf when it has none.
    Faster first; at equal time a policy that keeps its activations on the device
    (offloading needs Transformer Engine, host memory and PCIe traffic that then buy
    nothing), then the lower peak."""
    r = sb.result
    if r is None or r.best is None:
        return (float("inf"), False, 0)
    ms, peak = r.best.key
    return (ms, any(p.offloads for p in sb.policies), peak)


def _better(a: SpaceBest | None, b: SpaceBest) -> SpaceBest:
    return b if a is None or space_key(b) < space_key(a) else a


def plan_global(problem: Problem, pc: PolicyCosts, budget_s: float,
                ladder: tuple[str, ...] | None = None) -> SpaceBest:
    """The best of the three global modes: `ladder`'s, else the job's as `pc.arch` says
    (ppsim.policy.model.mode_ladder)."""
    best = None
    proven = True
    S = problem.split.num_stages
    ladder = ladder or mode_ladder(pc.arch)
    modes = ladder[:2] if pc.combined else ladder
    tried = []
    for i, mode in enumerate(modes):
        pol = (shorthand(mode),) * S
        r = plan(_fixed(problem, pc, pol), top_k=1,
                 time_budget_s=budget_s / (len(modes) - i) * 0.9)
        budget_s -= r.seconds
        proven = proven and (r.proven_optimal or r.best is None)
        tried.append(SpaceBest(space="global", result=r, policies=pol, label=mode))
        best = _better(best, tried[-1])
    assert best is not None
    if best.result is not None and best.result.best is None:  # none fits: the lowest peak
        best = min(tried, key=lowest_peak)
    return replace(best, proven=proven)


def lowest_peak(sb: SpaceBest) -> float:
    """The lowest peak any split of the space's plan reached (inf when it has none): of
    spaces where nothing fits, the one nearest to fitting."""
    r = sb.result
    return float(r.smallest_peak[0]) if r is not None and r.smallest_peak else math.inf


def megatron_points(pc: PolicyCosts, offload: bool) -> list[StagePolicy]:
    """The policies with N = 0 of the Megatron-expressible space: one fraction on every
    rank (Megatron's per-rank delta keeps whole groups per iteration, ppsim.policy.delta,
    not a lower fraction per rank)."""
    return list(module_groups(pc, offload))


def _proxy(search: SplitSearch, pc: PolicyCosts, policies: tuple[StagePolicy, ...],
           counts: tuple[int, ...]) -> tuple[float, float]:
    """A quick estimate of a fixed policy on one split, to rank the points before planning
    them: (ms, the fullest rank's bytes); ms is inf when a rank runs out of memory, else
    the busiest rank's m x (F + B) plus one pass through the stages (fill and drain)."""
    costs, offset = [], 0
    for k, n in enumerate(counts):
        costs.append(estimated(pc.stage_cost(policies[k], offset, n, k == 0,
                                             k == len(counts) - 1, search.receives[k])))
        offset += n
    busiest, fullest = 0.0, 0.0
    for r, stages in enumerate(search.rank_stages):
        rc = [costs[s] for s in stages]
        fullest = max(fullest, sum(c.static_bytes for c in rc) + search.rank_peak(r, rc))
        busiest = max(busiest, sum(c.forward_ms + c.backward_ms for c in rc))
    if fullest > search.memory:
        return float("inf"), fullest
    ms = busiest * search.m + sum(c.forward_ms + c.backward_ms for c in costs) / search.vpp
    return ms, fullest


def megatron_candidates(problem: Problem, pc: PolicyCosts, splits: list[tuple[int, ...]]
                        ) -> list[tuple[float, tuple[StagePolicy, ...], str]]:
    """Every point of the Megatron-expressible space with its quick estimate on the
    given splits, most promising first (where none fits, the nearest to fitting, then
    the one that recomputes the most layers: it holds the least on other splits too)."""
    S = problem.split.num_stages
    search = SplitSearch(replace(problem, memory=None))
    most = -(-problem.costs.num_layers // S) + 1
    out = []
    for g in megatron_points(pc, pc.host_link_gbps > 0):
        # Megatron takes --recompute-num-layers with full granularity only: N > 0
        # recomputes whole layers and no modules (and none under the combined 1F1B); N
        # all is its uniform method, which covers a stage of any size.
        whole = not g.recompute_modules and not pc.combined
        for n in [*range(0, most + 1), ALL_LAYERS] if whole else [0]:
            pol = (replace(g, recompute_layers=n),) * S
            est = min((_proxy(search, pc, pol, c) for c in splits),
                      default=(float("inf"), float("inf")))
            label = replace(g, recompute_layers=n).label()
            out.append(((*est, -n), pol, label))  # ties: the most layers recomputed
    out.sort(key=lambda x: x[0])
    return [(est[0], pol, label) for est, pol, label in out]


def plan_megatron(problem: Problem, pc: PolicyCosts, budget_s: float,
                  splits: list[tuple[int, ...]]) -> SpaceBest:
    """One module set (or one N) for every stage, offload with one fraction: the points
    ranked by their estimate on `splits`, the most promising
    planned (seeded with `splits`) while the budget lasts."""
    t0 = time.perf_counter()
    ranked = megatron_candidates(problem, pc, splits)
    best: SpaceBest | None = None
    planned = 0
    for est, pol, label in ranked:
        left = budget_s - (time.perf_counter() - t0)
        if planned and (left <= 0.05 * budget_s or est == float("inf")):
            break  # the first point is planned whatever is left: its seeds are timed
        share = left / 2 if planned == 0 else left / 3
        r = plan(_fixed(problem, pc, pol), top_k=1, time_budget_s=share, seeds=splits)
        planned += 1
        if r.best is not None and not host_fits(r.problem.with_split(r.best.split), pol):
            continue  # the offloaded microbatches overflow the node's host memory
        # Compared as the copy streams time it: the estimate may miss a stall.
        cand = resimulated(SpaceBest(space="megatron", result=r, policies=pol, label=label))
        best = _better(best, cand)
    proven = False  # the points not planned are only estimated
    if best is None:
        return SpaceBest(space="megatron", result=None)
    return replace(best, proven=proven)


def plan_per_stage(problem: Problem, pc: PolicyCosts, budget_s: float) -> SpaceBest:
    """Each stage its cheapest fitting policy of the groups (one chunk per rank)."""
    groups = module_groups(pc, pc.host_link_gbps > 0)
    search = SplitSearch(replace(problem, memory=None))
    inflight = [max((sum(rec[:search.vpp]) for rec in search.patterns[r]), default=0)
                for r in range(search.pp)]
    memory = Cheapest(costs=pc, groups=groups,
                      inflight=[inflight[problem.schedule.stage_rank(i)]
                                for i in range(search.S)])
    p = replace(problem, costs=pc.base, memory=memory)
    r = plan(p, top_k=1, time_budget_s=budget_s)
    if r.best is None:  # each stage took the policy that holds least (Cheapest)
        return SpaceBest(space="per-stage", result=r, label=LEAST_HELD)
    policies = chosen_policies(r)
    return resimulated(SpaceBest(space="per-stage", result=r, policies=policies,
                                 label="per stage", proven=r.proven_optimal))


LEAST_HELD = "each stage's policy that holds least"
"""The per-stage space's label where no split fits: what its lowest peak was planned under."""
PER_RANK = "per rank, on the best split found"
"""The per-stage space's label with several chunks per rank (refine_per_rank)."""


RANK_COMBOS = 4096
"""Per rank, the most combinations of its chunks' policies tried (options ** chunks);
beyond, every chunk of the rank takes the same option."""


def _rank_combos(options: int, chunks: int) -> Iterator[tuple[int, ...]]:
    """Option indices per chunk: each chunk its own, or (past RANK_COMBOS) one for all."""
    if options ** chunks <= RANK_COMBOS:
        return itertools.product(range(options), repeat=chunks)
    return ((o,) * chunks for o in range(options))


def refine_per_rank(problem: Problem, pc: PolicyCosts, start: SpaceBest) -> SpaceBest:
    """The per-stage space with several chunks per rank: a rank's memory is the sum of its
    chunks', so stages are not priced alone. The best split found (`start`'s) is kept
    and each rank's chunks take the policies (each chunk its own, of the groups, of
    each N, or the one it had; see RANK_COMBOS) that give the rank the least F + B time
    while it fits in memory: the best per-rank choice for that split (recompute and
    copies only lengthen ops), not a search over splits, so never proven. Never slower
    than `start`: it is kept when the refined policies simulate slower."""
    r = start.result
    if r is None or r.best is None:
        return SpaceBest(space="per-stage", result=None, label=PER_RANK)
    split = r.best.split
    counts, S = split.counts, split.num_stages
    search = SplitSearch(replace(problem.with_split(split), memory=None))
    offsets = [sum(counts[:k]) for k in range(S)]
    options: list[StagePolicy | None] = [None, *module_groups(pc, pc.host_link_gbps > 0), *(
        StagePolicy(recompute_layers=n) for n in range(1, 0 if pc.combined
                                                       else max(counts) + 1))]
    chosen = list(start.policies)

    def cost(k: int, option: StagePolicy | None) -> StageCost:
        pol = chosen[k] if option is None else option
        return estimated(pc.stage_cost(pol, offsets[k], counts[k], k == 0, k == S - 1,
                                       search.receives[k]))

    for rank, stages in enumerate(search.rank_stages):
        table = {(k, n): cost(k, o) for k in stages for n, o in enumerate(options)}
        best: tuple[float, tuple[int, ...]] | None = None
        for combo in _rank_combos(len(options), len(stages)):
            rc = [table[k, n] for k, n in zip(stages, combo, strict=True)]
            if sum(c.static_bytes for c in rc) + search.rank_peak(rank, rc) > search.memory:
                continue
            ms = sum(c.forward_ms + c.backward_ms for c in rc)
            if best is None or ms < best[0] - 1e-9:
                best = (ms, combo)
        if best is not None:
            for k, n in zip(stages, best[1], strict=True):
                chosen[k] = options[n] or chosen[k]
    policies = tuple(chosen)
    kept = replace(start, space="per-stage", label=PER_RANK, proven=False)
    fixed = replace(problem.with_split(split), costs=pc.base,
                    memory=Fixed(costs=pc, policies=policies))
    if not host_fits(fixed, policies):
        return kept
    summary = simulate(fixed, record=False).summary
    if (summary.iteration_time_ms, summary.peak_memory_bytes) >= r.best.key or not all(
            rs.fits for rs in summary.ranks):
        return kept
    best = replace(r.best, summary=summary)
    out = replace(r, best=best, candidates=[best], problem=replace(r.problem, memory=Fixed(
        costs=pc, policies=policies)))
    return SpaceBest(space="per-stage", result=out, policies=policies, label=PER_RANK,
                     copies=RESIMULATED if any(p.offloads for p in policies) else "")


def chosen_policies(r: PlanResult) -> tuple[StagePolicy, ...]:
    """The policy the per-stage search gave each stage of the best split."""
    search = SplitSearch(r.problem)
    assert r.best is not None
    sp = r.best.split
    return tuple(r.problem.memory.policy_of(st.offset, st.layers, st.index, st.index == 0,
                                            st.index == sp.num_stages - 1,
                                            search.receives[st.index], search.fits)
                 for st in sp.stages)
