"""One policy said two ways prices the same, to the last digit.

"Nothing recomputed, nothing offloaded" is the model without a [memory] section (recompute
"none"), an empty [memory] table, no modules, block N = 0, offload modules at fraction 0,
or per-stage tables that change nothing; "every layer recomputed" is recompute "full" or
block N over every layer; "core_attn" is recompute "selective" or that module list
(Megatron's selective default, TransformerConfig: recompute_modules defaults to
["core_attn"]). The model without a policy sums a stage's pieces in one order
(ppsim.costs.model.stage_cost); a policy's stage costs once summed them from prefix sums,
and the iteration times of one policy said two ways differed by about 1e-15."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.model import stage_costs
from ppsim.costs.modules import OFFLOAD_MODULES
from ppsim.pipeline.problem import build_problem
from ppsim.policy.model import ALL_LAYERS
from ppsim.sim.simulate import simulate

EMPTY = {"recompute_modules": []}, {"recompute_layers": 0}, {}
"""[memory] tables (or per-stage tables) that recompute and offload nothing."""


@st.composite
def jobs(draw: st.DrawFn) -> dict:
    preset = draw(st.sampled_from(["tiny-gpt", "tiny-llm", "tiny-hybrid", "llama3-8b"]))
    pp = draw(st.sampled_from([1, 2, 4]))
    return {"model": {"preset": preset, "tp": draw(st.sampled_from([1, 2]))},
            "hardware": {"preset": "h100-80gb"},
            "pipeline": {"pp": pp, "microbatches": draw(st.integers(1, 8)),
                         "schedule": draw(st.sampled_from(["1f1b", "gpipe", "zb-h1"]))}}


@st.composite
def empty_memory(draw: st.DrawFn, stages: int) -> dict:
    """A [memory] section that recomputes and offloads nothing, said one of the ways."""
    table = dict(draw(st.sampled_from(EMPTY)))
    if draw(st.booleans()):
        table.update(offload_modules=draw(st.lists(st.sampled_from(OFFLOAD_MODULES),
                                                   min_size=1, max_size=3, unique=True)),
                     offload_fraction=0.0)
    chosen = draw(st.lists(st.integers(0, stages - 1), unique=True, max_size=stages))
    if chosen:
        table["stage"] = [{"stage": i, **draw(st.sampled_from(EMPTY))} for i in chosen]
    return table


def _run(data: dict) -> tuple:
    problem = build_problem(config_from_dict(data))
    costs = stage_costs(problem.costs, problem.split, problem.memory)
    return costs, simulate(problem, record=False).summary


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs(), data=st.data())
def test_equivalent_empty_policies_give_identical_summaries(job: dict, data) -> None:
    plain_costs, plain = _run({**job, "model": {**job["model"], "recompute": "none"}})
    memory = data.draw(empty_memory(len(plain_costs)))
    # A table over recompute "selective" that sets no modules, or over "full" that sets
    # N = 0, recomputes nothing (the mode is shorthand for the table's defaults).
    modes = ["none", *(["selective"] if "recompute_modules" in memory else []),
             *(["full"] if "recompute_layers" in memory else [])]
    mode = data.draw(st.sampled_from(modes))
    costs, summary = _run({**job, "model": {**job["model"], "recompute": mode},
                           "memory": memory})
    assert costs == plain_costs
    assert summary == plain


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs(), mode=st.sampled_from(["selective", "full"]))
def test_a_global_mode_and_its_policy_give_identical_summaries(job: dict, mode: str) -> None:
    policy = {"selective": {"recompute_modules": ["core_attn"]},
              "full": {"recompute_layers": ALL_LAYERS}}[mode]
    given_mode = _run({**job, "model": {**job["model"], "recompute": mode}})
    said_as_policy = _run({**job, "model": {**job["model"], "recompute": "none"},
                           "memory": policy})
    assert said_as_policy == given_mode
