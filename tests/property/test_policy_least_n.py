"""The per-stage policy choice (Cheapest.policy_of) against every (group, N) of a stage,
on hybrid stacks, whose layers differ in what a whole-layer recompute holds: its
transient rises with the first layer of a larger kind, and an offloaded layer can keep
less than the input a whole recompute keeps, so a stage's memory does not fall
steadily with N. And with copies that stall at N = 0, a group's N = 0 time is no bound
on its others'."""

from __future__ import annotations

from functools import cache

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.model import StageCost
from ppsim.policy.costs import Cheapest, PolicyCosts
from ppsim.policy.model import StagePolicy
from ppsim.policy.search import module_groups
from ppsim.policy.setup import policy_costs
from ppsim.sim.copies import estimated

HYBRID = {"preset": "tiny-hybrid"}


@cache
def priced(pattern: str) -> PolicyCosts:
    cfg = config_from_dict({
        "model": {**HYBRID, "hybrid_layer_pattern": pattern, "num_layers": len(pattern)},
        "pipeline": {"pp": 1, "microbatches": 4, "schedule": "1f1b"},
        "hardware": {"preset": "h100-80gb"}})
    return policy_costs(cfg)


def memory(c: StageCost, inflight: int) -> int:
    return c.static_bytes + inflight * c.activation_bytes + c.transient_bytes


def options(pc: PolicyCosts, groups: list[StagePolicy], offset: int, count: int,
            first: bool, last: bool) -> list[tuple[StagePolicy, StageCost]]:
    out = []
    for g in groups:
        for n in range(count + 1):
            p = StagePolicy(recompute_modules=g.recompute_modules, recompute_layers=n,
                            offload_modules=g.offload_modules,
                            offload_fraction=g.offload_fraction)
            out.append((p, estimated(pc.stage_cost(p, offset, count, first, last, True))))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.text("M*-GE", min_size=2, max_size=8), offload=st.booleans(),
       data=st.data())
@example(pattern="M-*-G-E-", offload=False, data=None)  # the transient rises inside a stage
@example(pattern="M-*-G-E-", offload=True, data=None)   # an offloaded layer keeps less
def test_the_chosen_policy_is_the_least_work_that_fits(pattern, offload, data) -> None:
    pc = priced(pattern)
    groups = module_groups(pc, offload=offload)
    layers = len(pc.kinds)
    if data is None:  # (offset, count, in flight, option) where a bisection chose wrong
        cases = [(0, 3, 4, 101), (0, 6, 4, 173)] if offload else [(2, 3, 1, 17), (2, 2, 2, 13)]
    else:
        offset = data.draw(st.integers(0, layers - 1))
        count = data.draw(st.integers(1, layers - offset))
        cases = [(offset, count, data.draw(st.integers(1, 8)), data.draw(st.integers(0, 10**6)))]
    for offset, count, inflight, pick in cases:
        first, last = offset == 0, offset + count == layers
        opts = options(pc, groups, offset, count, first, last)
        # a limit at one option's memory: where a search that skips an N goes wrong
        limit = memory(opts[pick % len(opts)][1], inflight)

        def fits(_index: int, c: StageCost, limit: int = limit, inflight: int = inflight
                 ) -> bool:
            return memory(c, inflight) <= limit

        want = min((c.forward_ms + c.backward_ms for p, c in opts if fits(0, c)
                    and not pc.stalls(p, offset, count, first, last, True)), default=None)
        if want is None:
            continue
        chosen = Cheapest(costs=pc, groups=groups).policy_of(offset, count, 0, first, last,
                                                             True, fits)
        c = estimated(pc.stage_cost(chosen, offset, count, first, last, True))
        assert fits(0, c), (offset, count, chosen)
        assert c.forward_ms + c.backward_ms <= want * (1 + 1e-12), (offset, count, chosen)


def test_a_group_whose_copies_stall_at_n_0_is_still_tried() -> None:
    """Qwen3-Next's layers 8-32 with everything offloaded: at N = 0 the copies outlast the
    ops they hide behind, so the group's N = 0 time (stalls included) is no bound on the
    time of its N that do not stall; the fastest policy that fits is in that group."""
    cfg = config_from_dict({"model": {"preset": "qwen3-next-80b-a3b"},
                            "pipeline": {"pp": 1, "microbatches": 4, "schedule": "1f1b"},
                            "hardware": {"preset": "h100-80gb"}})
    pc = policy_costs(cfg)
    groups = module_groups(pc, offload=True)
    opts = options(pc, groups, 8, 25, False, False)
    limit = memory(opts[13][1], 4)

    def fits(_index: int, c: StageCost) -> bool:
        return memory(c, 4) <= limit

    ok = [(c.forward_ms + c.backward_ms, p) for p, c in opts
          if fits(0, c) and not pc.stalls(p, 8, 25, False, False, True)]
    want, fastest = min(ok, key=lambda x: x[0])
    assert pc.stalls(StagePolicy(recompute_modules=fastest.recompute_modules,
                                 offload_modules=fastest.offload_modules,
                                 offload_fraction=fastest.offload_fraction),
                     8, 25, False, False, True)
    chosen = Cheapest(costs=pc, groups=groups).policy_of(8, 25, 0, False, False, True, fits)
    c = estimated(pc.stage_cost(chosen, 8, 25, False, False, True))
    assert fits(0, c)
    assert c.forward_ms + c.backward_ms <= want * (1 + 1e-12), (chosen, fastest)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.text("M*-GE", min_size=2, max_size=8), offload=st.booleans(),
       inflight=st.integers(1, 8), pick=st.integers(0, 10**6), start=st.integers(0, 7),
       length=st.integers(1, 8))
# layer 5 (an MLP) keeps nothing under layernorm and mlp recompute with mlp_norm offloaded,
# its input recomputed whole: memory rises from N = 1 to 2 on layers 4-6
@example(pattern="M-*-G-E-", offload=True, inflight=1, pick=25, start=4, length=3)
# layer 3 (an MLP under layernorm and mlp recompute) keeps its input either way, but
# recomputed whole it brings a larger transient than attention's before it
@example(pattern="M-*-G-E-", offload=False, inflight=1, pick=4, start=2, length=2)
def test_memory_falls_with_n_between_two_rises(pattern, offload, inflight, pick, start,
                                               length) -> None:
    """What the least-N search stands on: past each of PolicyCosts.memory_rises, up to
    the next, one more whole-recomputed layer never raises the stage's memory, nor its
    host bytes, and never makes its copies stall."""
    pc = priced(pattern)
    groups = module_groups(pc, offload=offload)
    g = groups[pick % len(groups)]
    layers = len(pc.kinds)
    offset = start % layers
    count = 1 + (length - 1) % (layers - offset)
    first, last = offset == 0, offset + count == layers
    rises = set(pc.memory_rises(g, offset, count))
    assert 1 in rises and rises <= set(range(1, count + 1))
    prev = None
    for n in range(1, count + 1):
        p = StagePolicy(recompute_modules=g.recompute_modules, recompute_layers=n,
                        offload_modules=g.offload_modules, offload_fraction=g.offload_fraction)
        now = (memory(estimated(pc.stage_cost(p, offset, count, first, last, True)), inflight),
               pc.host_bytes(p, offset, count),
               pc.stalls(p, offset, count, first, last, True))
        if prev is not None and n not in rises:
            assert now[0] <= prev[0] and now[1] <= prev[1] and now[2] <= prev[2], (n, prev, now)
        prev = now


def test_under_the_combined_1f1b_only_module_sets_are_chosen() -> None:
    """Megatron's combined 1F1B refuses whole-layer recompute: N stays 0, and a stage
    that no module set fits gets the least memory (the planner then refuses it)."""
    cfg = config_from_dict({
        "model": {"preset": "mixtral-8x7b", "num_layers": 4, "ep": 8, "dp": 8},
        "pipeline": {"pp": 1, "microbatches": 4, "overlap_moe_expert_parallel_comm": True},
        "hardware": {"preset": "h100-80gb"}})
    pc = policy_costs(cfg)
    assert pc.combined
    groups = module_groups(pc, offload=True)
    opts = [(p, c) for p, c in options(pc, groups, 0, 4, True, True) if p.recompute_layers == 0]
    for limit in sorted({memory(c, 4) for _, c in opts} | {0}):
        def fits(_index: int, c: StageCost, limit: int = limit) -> bool:
            return memory(c, 4) <= limit

        chosen = Cheapest(costs=pc, groups=groups).policy_of(0, 4, 0, True, True, True, fits)
        assert chosen.recompute_layers == 0
        c = estimated(pc.stage_cost(chosen, 0, 4, True, True, True))
        ok = [x.forward_ms + x.backward_ms for p, x in opts
              if fits(0, x) and not pc.stalls(p, 0, 4, True, True, True)]
        if ok:
            assert fits(0, c) and c.forward_ms + c.backward_ms <= min(ok) * (1 + 1e-12)
        else:
            assert c.static_bytes + c.activation_bytes == min(
                x.static_bytes + x.activation_bytes for _, x in opts)
