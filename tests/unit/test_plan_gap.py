"""An unproven chunked plan says where its gap lies: the bound's distance below the
mean rank's compute, the busiest rank's compute above the mean, its idle time."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.plan.gap import chunked_gap
from ppsim.sim.simulate import simulate


def _summary(split: list[int]):
    cfg = config_from_dict({"model": {"preset": "tiny-llm"},
                            "pipeline": {"pp": 2, "vpp": 2, "microbatches": 4,
                                         "schedule": "interleaved-1f1b", "split": split},
                            "hardware": {"preset": "cpu"}})
    return simulate(build_problem(cfg)).summary


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=3, max_size=3), st.floats(0.0, 1.0))
def test_the_three_parts_add_up_to_the_gap(cuts: list[int], share: float) -> None:
    at = sorted(cuts)  # tiny-llm's 8 layers over 4 virtual stages
    s = _summary([b - a for a, b in zip([0, *at], [*at, 8], strict=True)])
    lower = share * s.iteration_time_ms
    g = chunked_gap(s, lower)
    parts = g.bound_below_mean_ms + g.imbalance_ms + g.idle_ms
    assert abs(parts - (s.iteration_time_ms - lower)) <= 1e-9 * s.iteration_time_ms
    assert g.imbalance_ms >= 0 and g.idle_ms >= 0
    assert g.busy_ms == max(r.busy_ms for r in s.ranks)


def test_an_unproven_chunked_plan_prints_why(capsys) -> None:
    argv = ["plan", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--pp", "16",
            "--vpp", "2", "--schedule", "interleaved-1f1b", "--microbatches", "64",
            "--recompute", "full", "--time-budget", "0.5"]
    assert main([*argv, "--json"]) in (0, 3)
    out = json.loads(capsys.readouterr().out)
    assert not out["proven_optimal"]
    gap = out["bound_gap"]
    t = out["best"]["iteration_time_ms"]
    assert abs(gap["bound_below_mean_ms"] + gap["imbalance_ms"] + gap["idle_ms"]
               - (t - out["lower_bound_ms"])) <= 1e-6 * t
    assert "why the gap" in out["bound_note"]
