"""stage_busy_ms, what the job search bounds each shape by before simulating it: per
virtual stage, the least busy time of built stages (least_busy_ms of stage_costs), read
from the layers' prefix sums; and microbatches x its busiest rank is no longer than the
simulated iteration."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import combined, random_problems
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.model import least_busy_ms, stage_busy_ms, stage_costs
from ppsim.sim.simulate import simulate


@settings(max_examples=80, deadline=None)
@given(random_problems(), st.lists(st.floats(0.0, 3.0), min_size=1, max_size=4),
       st.lists(st.floats(0.01, 9.0), min_size=1, max_size=5), st.booleans())
def test_stage_busy_is_the_built_stages_least_busy_time(problem, savings, forwards, pair):
    layers = tuple(replace(c, forward_ms=forwards[i % len(forwards)])
                   for i, c in enumerate(problem.costs.layers))
    problem = replace(problem, costs=replace(problem.costs, layers=layers))
    s = problem.schedule
    if pair and (s.name == "interleaved-1f1b" or (s.name == "1f1b" and s.pp == 1)):
        problem = combined(problem, savings)
    split = problem.split
    built = [least_busy_ms(c) for c in stage_costs(problem.costs, split)]
    assert stage_busy_ms(problem.costs, split) == pytest.approx(built, rel=1e-12, abs=1e-12)
    busy = [0.0] * split.pp
    for st_, ms in zip(split.stages, stage_busy_ms(problem.costs, split), strict=True):
        busy[split.stage_rank(st_.index)] += ms
    m = problem.schedule.microbatches
    assert m * max(busy) <= simulate(problem).summary.iteration_time_ms * (1 + 1e-9)
