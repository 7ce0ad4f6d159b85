"""The frameworks' own split rules, re-stated here from their source, against ppsim's.

Each re-statement follows its framework's code line by line (cited below), so a
change to ppsim's implementation (vectorised loops, early stops, arithmetic in
place of lists of names) is checked against what the framework computes, not
against itself:

- DeepSpeed edaa722, deepspeed/runtime/utils.py: partition_uniform, partition_balanced
  (the dynamic program over max - min, from v0.12.5); runtime/pipe/module.py
  _partition_layers ('parameters' over _count_layer_params, 'uniform' over the specs).
- torchtitan b5bcd76, torchtitan/distributed/pipeline_parallel.py:
  _generate_llm_fqn_per_model_part with its default weights 1 and 1.
- Megatron-LM d98e8a6, megatron/core/pipeline_parallel/schedules.py:
  forward_backward_pipelining_with_interleaving's microbatch-group checks and
  get_schedule_table.
"""

from __future__ import annotations

import math

import pytest
from helpers import uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.plan import plan_with_references
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.errors import UserError
from ppsim.pipeline.exports import DeepSpeedSpecs
from ppsim.pipeline.megatron_rules import group_refusal
from ppsim.plan.baselines import (
    deepspeed_splits,
    partition_balanced,
    partition_uniform,
    torchtitan_counts,
    torchtitan_split,
)
from ppsim.schedules.generators import build_schedule, interleaved_group, interleaved_order
from ppsim.schedules.validate import validate

# ---------------------------------------------------------------- DeepSpeed, re-stated


def ds_partition_uniform(num_items, num_parts):
    parts = [0] * (num_parts + 1)
    if num_items <= num_parts:
        for p in range(num_parts + 1):
            parts[p] = min(p, num_items)
        return parts
    chunksize = num_items // num_parts
    residual = num_items - (chunksize * num_parts)
    parts = list(range(0, (num_parts + 1) * chunksize, chunksize))
    for i in range(residual):
        for q in range(i + 1, len(parts)):
            parts[q] += 1
    return parts


def ds_partition_balanced(weights, num_parts):
    n, m = len(weights), num_parts
    if n <= m:
        return ds_partition_uniform(n, m)
    inf = math.inf
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix_sum = [0.0] * (n + 1)
    running = 0
    for i, w in enumerate(weights):  # np.cumsum of ints, stored in a float64 array
        running += w
        prefix_sum[i + 1] = float(running)
    dp_max[0][0] = 0
    dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                max_sum = max(dp_max[k][j - 1], prefix_sum[i] - prefix_sum[k])
                min_sum = min(dp_min[k][j - 1], prefix_sum[i] - prefix_sum[k])
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j] = cost
                    dp_max[i][j] = max_sum
                    dp_min[i][j] = min_sum
                    position[i][j] = k
    parts = [n]
    for i in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][i])
    parts.reverse()
    return parts


def ds_counts(parts, before, layers):
    """Decoder layers per stage of DeepSpeed's parts over [before..., layers, after...]."""
    return tuple(len(set(range(a, b)) & set(range(before, before + layers)))
                 for a, b in zip(parts, parts[1:], strict=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=24), st.integers(1, 9))
def test_partition_balanced_is_deepspeeds(weights, parts):
    assert partition_balanced(weights, parts) == ds_partition_balanced(weights, parts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 7, 10**6]), min_size=1, max_size=20),
       st.integers(1, 8))
def test_partition_balanced_ties_are_deepspeeds(weights, parts):
    # Few distinct weights: many tied costs, where the last cut wins in DeepSpeed's loop.
    assert partition_balanced(weights, parts) == ds_partition_balanced(weights, parts)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 40))
def test_partition_uniform_is_deepspeeds(items, parts):
    assert partition_uniform(items, parts) == ds_partition_uniform(items, parts)


@st.composite
def model_costs(draw):
    layers = draw(st.integers(1, 20))
    params = st.integers(0, 10**9)
    return ModelCosts(layers=tuple(LayerCost(params=draw(params), static_bytes=1)
                                   for _ in range(layers)),
                      embedding=LayerCost(params=draw(params)),
                      head=LayerCost(params=draw(params) + 1))


@settings(max_examples=300, deadline=None)
@given(model_costs(), st.integers(1, 8), st.integers(1, 3), st.integers(1, 4))
def test_deepspeed_baselines_are_what_deepspeed_builds(costs, pp, before, after):
    """The plan's DeepSpeed rows: _partition_layers over the spec list, mapped to counts."""
    specs = DeepSpeedSpecs(before=before, after=after)
    L = costs.num_layers
    weights = ([costs.embedding.params] + [0] * (before - 1)
               + [lc.params for lc in costs.layers] + [0] * (after - 1) + [costs.head.params])
    by_rule = {"deepspeed_parameters": ds_partition_balanced(weights, pp),
               "deepspeed_uniform": ds_partition_uniform(len(weights), pp)}
    for got in deepspeed_splits(costs, pp, 1, specs):
        parts = by_rule[got.key]
        if any(b <= a for a, b in zip(parts, parts[1:], strict=False)):
            assert got.counts is None and "empty" in got.note  # DeepSpeed builds an empty stage
        else:
            assert got.counts == ds_counts(parts, before, L)
            assert sum(got.counts) == L


def test_deepspeed_has_no_chunks():
    costs = ModelCosts(layers=(LayerCost(params=1),) * 8)
    assert all(s.counts is None and "one stage per rank" in s.note
               for s in deepspeed_splits(costs, 2, 2, DeepSpeedSpecs()))


# ---------------------------------------------------------------- torchtitan, re-stated


def tt_generate(num_stages, num_layers, input_weight=1, output_weight=1):
    if num_stages < 1:
        raise ValueError("Number of stages must be at least 1")
    if num_stages == 1:
        return [["tok_embeddings"] + [f"layers.{i}" for i in range(num_layers)]
                + ["norm", "lm_head"]]
    num_effective_layers = num_layers + input_weight + output_weight
    if num_stages > num_effective_layers:
        raise ValueError("more stages than effective layers")
    layers_per_stage = num_effective_layers // num_stages
    extra_layers = num_effective_layers % num_stages
    if layers_per_stage == 0:
        raise ValueError("empty stages")
    if input_weight > layers_per_stage or output_weight > layers_per_stage:
        raise ValueError("weight exceeds layers per stage")
    out, current_layer = [], 0
    for stage_idx in range(num_stages):
        stage_modules = []
        effective = layers_per_stage + (1 if stage_idx < extra_layers else 0)
        if stage_idx == 0:
            stage_modules.append("tok_embeddings")
            remaining = effective - input_weight
        elif stage_idx == num_stages - 1:
            remaining = effective - output_weight
        else:
            remaining = effective
        for _ in range(remaining):
            if current_layer < num_layers:
                stage_modules.append(f"layers.{current_layer}")
                current_layer += 1
        if stage_idx == num_stages - 1:
            stage_modules.extend(["norm", "lm_head"])
        out.append(stage_modules)
    return out


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(1, 40), st.integers(0, 3), st.integers(0, 3))
def test_torchtitan_split_is_torchtitans(layers, stages, w_in, w_out):
    try:
        names = tt_generate(stages, layers, w_in, w_out)
    except ValueError:
        assert isinstance(torchtitan_counts(layers, stages, w_in, w_out), str)
        return
    want = tuple(sum(n.startswith("layers.") for n in part) for part in names)
    assert torchtitan_counts(layers, stages, w_in, w_out) == want


def test_torchtitan_default_the_issues_example():
    # 25 layers on pp 6: torchtitan's 4,5,5,4,4,3 (ppsim's near-even split is 4,5,4,4,4,4).
    assert torchtitan_split(25, 6, 0).counts == (4, 5, 5, 4, 4, 3)
    assert "MTP" in torchtitan_split(25, 6, 1).note


# ---------------------------------------------------------------- Megatron, re-stated


def megatron_group_check(pp, num_microbatches, group):
    """forward_backward_pipelining_with_interleaving's checks: raise as Megatron does."""
    if group > num_microbatches or group < pp:
        raise ValueError("The number of contiguous micro-batches in a virtual pipeline stage"
                         f"should range in [PP={pp} , M={num_microbatches}]")
    final_microbatch_group_size = num_microbatches % group
    if 0 < final_microbatch_group_size < pp:
        raise RuntimeError("The remainder of M ... should be 0, or larger than or equal to "
                           "the pipeline-parallel size")


def megatron_schedule_table(num_microbatches, num_model_chunks, group):
    table = []
    for lo in range(0, num_microbatches, group):
        if lo + group >= num_microbatches:
            table.extend([(mb, c) for c in range(num_model_chunks)
                          for mb in range(lo, num_microbatches)])
        else:
            table.extend([(mb, c) for c in range(num_model_chunks)
                          for mb in range(lo, lo + group)])
    return table


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8), st.integers(1, 40), st.integers(1, 48))
def test_group_rule_is_megatrons(pp, m, group):
    try:
        megatron_group_check(pp, m, group)
    except (ValueError, RuntimeError):
        assert group_refusal(pp, m, group) is not None
    else:
        assert group_refusal(pp, m, group) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 40))
def test_ppsims_own_group_is_one_megatron_accepts(pp, m):
    if m < pp:
        with pytest.raises(ValueError):
            megatron_group_check(pp, m, interleaved_group(pp, m))
    else:
        megatron_group_check(pp, m, interleaved_group(pp, m))  # raises if Megatron refuses


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 4), st.integers(2, 3), st.integers(1, 12), st.data())
def test_interleaved_order_follows_the_group_flag(pp, vpp, m, data):
    group = data.draw(st.integers(1, m))
    assert interleaved_order(m, vpp, group) == megatron_schedule_table(m, vpp, group)
    try:
        megatron_group_check(pp, m, group)
    except (ValueError, RuntimeError):
        if group != interleaved_group(pp, m):  # torch's one group of m < pp still runs
            with pytest.raises(UserError, match="microbatch_group_size"):
                build_schedule("interleaved-1f1b", pp, vpp, m, group)
            return
    sched = build_schedule("interleaved-1f1b", pp, vpp, m, group)
    validate(sched)  # complete and deadlock-free for any group size it takes
    assert sched.microbatch_group == group
    # Rank 0's forwards walk Megatron's table for that group size.
    fwd = [(a.microbatch, a.stage // pp) for a in sched.actions[0] if a.kind == "F"]
    assert fwd == megatron_schedule_table(m, vpp, group)


# ---------------------------------------------------------------- the plan against them


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.integers(2, 12), st.integers(1, 8),
       st.floats(0.0, 6.0))
def test_the_plan_is_never_slower_than_a_framework(pp, per_stage, m, head_ms, emb_ms):
    """Every framework's split seeds the search, so the best is at least as fast."""
    problem = uniform_problem(pp, 1, m, "1f1b", layers_per_stage=per_stage,
                              head={"forward_ms": head_ms, "backward_ms": 2 * head_ms},
                              emb={"forward_ms": emb_ms})
    planned = plan_with_references(problem, [], top_k=1, budget_s=2.0)
    best = planned.result.best.summary.iteration_time_ms
    keys = {r.key for r in planned.frameworks}
    assert keys == {"deepspeed_parameters", "deepspeed_uniform", "torchtitan"} or \
        {f.key for f in planned.without} == {"deepspeed_parameters", "deepspeed_uniform",
                                             "torchtitan"} - keys
    for ref in planned.frameworks:
        assert best <= ref.summary.iteration_time_ms * (1 + 1e-9), ref.label
