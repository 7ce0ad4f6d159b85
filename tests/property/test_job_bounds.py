"""A job shape's bounds before it is simulated (ppsim.job.pending.Pending) hold: no
schedule runs its default split faster than bound_ms, and no split it plans (one chunk a
rank) is faster than least_ms. The search drops shapes by them (ppsim.job.walk), so one
above a time a split reaches would lose a shape that might be the fastest."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.errors import UserError
from ppsim.job.choice import least_reach_ms, reachable_ms
from ppsim.job.pending import pending_shape
from ppsim.job.shapes import shapes
from ppsim.job.walk import shape_result
from ppsim.pipeline.problem import build_problem
from ppsim.plan.planner import plan
from ppsim.sim.simulate import simulate

CFGS = {name: config_from_args(build_parser().parse_args(
    ["plan", "--preset", name, "--num-layers", "6", "--hardware", "h100-80gb"]))
    for name in ("llama3-8b", "mixtral-8x7b")}


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(CFGS)), gpus=st.sampled_from([4, 8, 16]),
       gbs=st.sampled_from([8, 16, 32]), data=st.data())
def test_no_split_beats_the_bounds(name, gpus, gbs, data) -> None:
    p = _drawn(CFGS[name], gpus, gbs, data, one_chunk=True)
    problem = build_problem(p.cfg, p.costs)
    default = simulate(problem, record=False).summary.iteration_time_ms
    assert p.least_ms <= p.bound_ms <= default * (1 + 1e-9)
    res = plan(problem, top_k=3, time_budget_s=1.0)
    for c in (*res.candidates, res.baseline):
        if c is not None:
            assert p.least_ms <= c.summary.iteration_time_ms * (1 + 1e-9)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(CFGS)), gpus=st.sampled_from([4, 8, 16]),
       gbs=st.sampled_from([8, 16, 32]), memory_gb=st.sampled_from([20, 30, 45, 80]),
       data=st.data())
def test_the_reach_is_no_less_than_its_bound_before_simulating(name, gpus, gbs, memory_gb,
                                                              data) -> None:
    """The bounded-out shapes are passed over unsimulated where least_reach_ms is no
    less than the best: it must never exceed the reach the simulation gives."""
    cfg = replace(CFGS[name], hardware=replace(CFGS[name].hardware,
                                               memory_bytes=memory_gb * 10**9))
    p = _drawn(cfg, gpus, gbs, data, one_chunk=False)
    shape, problem = p.shape, build_problem(p.cfg, p.costs)
    got = shape_result(shape, problem, simulate(problem, record=False).summary)
    least = least_reach_ms(problem, shape.pp, shape.microbatches)
    assert least <= reachable_ms(got) * (1 + 1e-9)


def _drawn(cfg, gpus: int, gbs: int, data, one_chunk: bool):
    """A pipelined shape of the job drawn by `data`, priced (Pending); the draw is
    dropped where Megatron refuses the shape."""
    todo = [s for s in shapes(cfg.model.arch, gpus, gbs, 8, cfg.model.total_layers)
            if s.pp > 1 and (s.vpp == 1 or not one_chunk)]
    assume(todo)
    try:
        return pending_shape(cfg, data.draw(st.sampled_from(todo)), gbs)
    except UserError:
        assume(False)
