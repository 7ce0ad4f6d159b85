"""The split x per-stage policy planner against brute force: every split, every policy
of every stage, simulated."""

from __future__ import annotations

import itertools
from dataclasses import replace

from helpers import all_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppsim.config.overrides import with_overrides
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.pipeline.split import split_from_counts
from ppsim.plan.planner import plan
from ppsim.policy.costs import Cheapest, Fixed
from ppsim.policy.model import StagePolicy
from ppsim.policy.search import chosen_policies, module_groups, plan_megatron
from ppsim.policy.setup import policy_costs
from ppsim.sim.simulate import simulate

TINY = {"kind": "transformer", "num_layers": 4, "hidden_size": 64, "num_heads": 4,
        "num_kv_heads": 4, "ffn_hidden_size": 256, "vocab_size": 512, "seq_length": 64,
        "micro_batch_size": 2, "dtype": "bf16"}


@st.composite
def stacks(draw):
    layers = draw(st.integers(2, 4))
    pp = draw(st.integers(1, 3 if layers <= 3 else 2))
    m = draw(st.integers(1, 4))
    if draw(st.booleans()):  # a hybrid stack: layers that differ in what they hold
        model = {"preset": "tiny-hybrid", "num_layers": layers,
                 "hybrid_layer_pattern": draw(st.text("M*-GE", min_size=layers,
                                                      max_size=layers))}
    else:
        model = {**TINY, "num_layers": layers, "gated_mlp": draw(st.booleans())}
    cfg = config_from_dict({
        "model": model,
        "pipeline": {"pp": pp, "microbatches": m, "schedule": "1f1b"},
        "hardware": {"preset": "h100-80gb"}})
    problem = build_problem(with_overrides(cfg, split={}))
    pc = policy_costs(cfg)
    frac = draw(st.floats(0.0, 1.0))
    return problem, pc, frac


def options(groups: list[StagePolicy], layers: int) -> list[StagePolicy]:
    return [replace(g, recompute_layers=n) for g in groups for n in range(layers + 1)]


def brute_force(problem, pc, groups) -> float:
    """The fastest simulated (split, policy per stage) that fits, or inf."""
    s = problem.split
    best = float("inf")
    for counts in all_counts(s.num_layers, s.num_stages):
        sp = split_from_counts(counts, s.pp, s.vpp, s.num_layers, s.placement)
        for pols in itertools.product(*(options(groups, n) for n in counts)):
            p = replace(problem.with_split(sp), costs=pc.base,
                        memory=Fixed(costs=pc, policies=tuple(pols)))
            summary = simulate(p, record=False).summary
            if summary.fits:
                best = min(best, summary.iteration_time_ms)
    return best


def limit_between(problem, pc, groups, frac: float) -> float:
    """A memory limit between the even split's peak with every layer recomputed and
    with nothing recomputed, so that the policy matters."""
    peaks = []
    for n in (0, 1 << 20):
        pol = (replace(groups[0], recompute_layers=n),) * problem.split.num_stages
        p = replace(problem, costs=pc.base, memory=Fixed(costs=pc, policies=pol))
        peaks.append(simulate(p, record=False).summary.peak_memory_bytes)
    return peaks[1] + frac * (peaks[0] - peaks[1]) + 1


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks())
def test_per_stage_planner_equals_brute_force(case) -> None:
    problem, pc, frac = case
    groups = module_groups(pc, offload=False)
    limit = limit_between(problem, pc, groups, frac)
    problem = replace(problem, hardware=replace(problem.hardware, memory_bytes=limit))
    want = brute_force(problem, pc, groups)
    r = plan(replace(problem, costs=pc.base, memory=Cheapest(costs=pc, groups=groups)),
             time_budget_s=60)
    assert r.proven_optimal or r.best is None
    got = r.best.summary.iteration_time_ms if r.best else float("inf")
    assert got == want or abs(got - want) <= 1e-9 * want, (got, want)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks())
def test_the_chosen_policies_simulate_to_the_planned_time(case) -> None:
    """What the planner reports for its per-stage policy is what simulate gives it."""
    problem, pc, frac = case
    groups = module_groups(pc, offload=True)  # copies over the host link too
    limit = limit_between(problem, pc, groups, frac)
    problem = replace(problem, hardware=replace(problem.hardware, memory_bytes=limit))
    r = plan(replace(problem, costs=pc.base, memory=Cheapest(costs=pc, groups=groups)),
             time_budget_s=60)
    if r.best is None:
        return
    pols = chosen_policies(r)
    p = replace(problem.with_split(r.best.split), costs=pc.base,
                memory=Fixed(costs=pc, policies=pols))
    s = simulate(p, record=False).summary
    assert s.fits
    assert s.iteration_time_ms == r.best.summary.iteration_time_ms
    assert [x.peak_memory_bytes for x in s.ranks] == \
        [x.peak_memory_bytes for x in r.best.summary.ranks]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks())
def test_megatron_space_is_never_faster_than_per_stage(case) -> None:
    problem, pc, frac = case
    groups = module_groups(pc, offload=False)
    limit = limit_between(problem, pc, groups, frac)
    problem = replace(problem, hardware=replace(problem.hardware, memory_bytes=limit))
    per = plan(replace(problem, costs=pc.base, memory=Cheapest(costs=pc, groups=groups)),
               time_budget_s=60)
    pc.host_link_gbps = 0.0  # no offload points: the spaces differ in recompute only
    meg = plan_megatron(problem, pc, 30.0, [problem.split.counts])
    if meg.result is not None and meg.result.best is not None:
        assert per.best is not None
        assert per.best.summary.iteration_time_ms <= \
            meg.result.best.summary.iteration_time_ms * (1 + 1e-12)
