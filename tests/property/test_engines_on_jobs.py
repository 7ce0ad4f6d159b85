"""The event engine, the simpy engine and the planner's evaluator on whole jobs of real
presets: tensor, context, expert and data parallelism with their collectives on the
links, Megatron's overlaps, FP8, the combined 1F1B and DeepEP, on random splits."""

from __future__ import annotations

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from ppsim.config.overrides import with_overrides
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.pipeline.problem import Problem, build_problem
from ppsim.pipeline.split import split_from_counts
from ppsim.plan.search import SplitSearch
from ppsim.sim import simpy_engine
from ppsim.sim.simulate import simulate
from ppsim.sim.summary import Summary

PRESETS = ("llama3-70b", "deepseek-v3", "nemotron-h-8b", "qwen3-next-80b-a3b",
           "gpt-oss-120b", "qwen3-30b-a3b", "mixtral-8x7b")
SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zbv", 2))


@st.composite
def jobs(draw) -> Problem:
    schedule, vpp = draw(st.sampled_from(SCHEDULES))
    pp = draw(st.sampled_from((2, 4)))
    model: dict = {"preset": draw(st.sampled_from(PRESETS)),
                   "recompute": draw(st.sampled_from(("none", "selective", "full")))}
    pipe: dict = {"pp": pp, "vpp": vpp, "schedule": schedule,
                  "microbatches": pp * draw(st.sampled_from((1, 2, 4)))}
    for size in ("tp", "cp", "ep", "dp"):
        if draw(st.booleans()):
            model[size] = draw(st.sampled_from((1, 2, 4, 8)))
    if draw(st.booleans()):
        model["distributed_optimizer"] = True
        pipe["overlap_grad_reduce"] = True
        pipe["overlap_param_gather"] = draw(st.booleans())
    if model.get("tp", 1) > 1 and draw(st.booleans()):
        pipe["tp_comm_overlap"] = True
    if draw(st.integers(0, 3)) == 0:
        model["fp8"] = "e4m3"
    if draw(st.integers(0, 3)) == 0:
        pipe["overlap_moe_expert_parallel_comm"] = True
        pipe["delay_wgrad_compute"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        pipe["moe_token_dispatcher_type"] = "flex"
    try:
        cfg = config_from_dict({"model": model, "pipeline": pipe,
                                "hardware": {"preset": "h100-80gb"}})
        problem = build_problem(with_overrides(cfg, split={}))
    except UserError:
        reject()  # a job Megatron (or ppsim) refuses
    s = problem.split
    cuts = sorted(draw(st.lists(st.integers(1, s.num_layers - 1), min_size=s.num_stages - 1,
                                max_size=s.num_stages - 1, unique=True)))
    counts = tuple(b - a for a, b in zip([0, *cuts], [*cuts, s.num_layers], strict=True))
    try:
        split = split_from_counts(counts, s.pp, s.vpp, s.num_layers, s.placement, mtp=s.mtp)
    except UserError:
        reject()  # a split the model refuses (its MTP layers off the last stage)
    return problem.with_split(split)


def key(s: Summary) -> tuple[float, tuple[int, ...]]:
    return round(s.iteration_time_ms, 9), tuple(r.peak_memory_bytes for r in s.ranks)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(jobs())
def test_both_engines_and_the_planner_time_a_job_alike(problem: Problem) -> None:
    event = simulate(problem, record=False).summary
    assert key(simpy_engine.simulate(problem, record=False).summary) == key(event)
    assert key(SplitSearch(problem).evaluate(problem.split.counts)) == key(event)
