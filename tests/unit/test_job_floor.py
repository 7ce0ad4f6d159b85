"""The job search passes over a shape no split could fit: the activations its schedule
holds on each rank, with its weights and optimizer state, overflow memory under any
split (ppsim.plan.floor). Before, such shapes were simulated and planned: on DeepSeek-V3
with context parallelism's traffic searched, the 60 s budget ran out on them before any
shape that fits was reached."""

from __future__ import annotations

import pytest

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser, main
from ppsim.job import walk
from ppsim.job.pending import shape_config
from ppsim.job.search import search_job
from ppsim.pipeline.problem import build_problem
from ppsim.plan.floor import MemoryFloor, memory_floors

ARGS = ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb"]


def _cfg(memory_gb: str):
    return config_from_args(build_parser().parse_args([*ARGS, "--memory-gb", memory_gb]))


def _no_floor(problem):
    real = memory_floors(problem)
    return type("Floors", (), {"floor": MemoryFloor(static_bytes=real.floor.static_bytes,
                                                    peak_bytes=0, inflight=())})()


def _fits(res) -> list[tuple[str, float]]:
    return [(r.shape.label(), r.summary.iteration_time_ms) for r in res.candidates
            if r.summary.fits]


@pytest.mark.parametrize("memory_gb", ["8", "20"])
def test_the_floor_passes_over_only_shapes_that_do_not_fit(memory_gb, monkeypatch) -> None:
    cfg = _cfg(memory_gb)
    floored = search_job(cfg, 16, 32, budget_s=30)
    assert floored.complete and floored.over_floor > 0
    with monkeypatch.context() as m:
        m.setattr(walk, "memory_floors", _no_floor)
        every = search_job(cfg, 16, 32, budget_s=30)
    assert every.over_floor == 0
    assert floored.evaluated + floored.over_floor == every.evaluated
    # As fast a best; the shapes passed over fit under no split. (The rest of the
    # table may differ: a shape tied with one passed over gets a split of its own.)
    assert _fits(floored)[0][1] <= _fits(every)[0][1]
    simulated = {r.shape.label() for r in floored.candidates}
    passed = [r for r in every.candidates if r.shape.label() not in simulated]
    assert len(passed) == floored.over_floor
    for r in passed:
        assert not r.summary.fits
        problem = build_problem(shape_config(cfg, r.shape, 32))
        assert memory_floors(problem).floor.peak_bytes > problem.hardware.memory_bytes


def test_when_no_shape_reached_fits_the_nearest_is_shown(capsys) -> None:
    """At 4 GB every shape whose weights fit holds too many activations: one simulated
    row (the one whose floor is least) says how far over it is; the line above counts
    the rest."""
    res = search_job(_cfg("4"), 16, 32, budget_s=30)
    assert res.evaluated == 1 and res.over_floor > 0
    assert not res.candidates[0].summary.fits
    nearest = res.candidates[0].problem
    least = memory_floors(nearest).floor.peak_bytes
    assert least > nearest.hardware.memory_bytes
    assert main([*ARGS, "--memory-gb", "4", "--gpus", "16", "--global-batch-size", "32"]) == 3
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())
    assert f"{res.over_floor} over memory under any split with the activations" in out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "no shape fits 4.00 GB per GPU" in err
    assert "(--search policy)" in err


def test_a_memory_policy_search_passes_over_no_shape() -> None:
    """The floor counts the activations the configured mode keeps; a policy search may
    recompute them, so it simulates every shape the bound reaches: here one that only
    a recompute makes fit leads."""
    res = search_job(_cfg("4"), 16, 32, budget_s=20, policy="policy")
    assert res.over_floor == 0
    best = res.candidates[0]
    assert best.summary.fits and best.policy not in ("", "none")
    problem = build_problem(shape_config(_cfg("4"), best.shape, 32))
    assert memory_floors(problem).floor.peak_bytes > problem.hardware.memory_bytes


def test_a_policy_search_that_fits_nothing_says_so(capsys) -> None:
    """Before: the table of shapes over memory, and exit 3 with nothing on stderr."""
    argv = [*ARGS, "--memory-gb", "3.5", "--gpus", "16", "--global-batch-size", "32",
            "--search", "policy", "--time-budget", "20"]
    assert main(argv) == 3
    # Under load the search's progress lines come first (a log's throttled lines).
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("ppsim plan: no shape fits 3.50 GB per GPU, whatever memory policy "
                       "the search tried on it; give more GPUs (--gpus)")
    assert all(" of " in line and line.endswith(" s)") for line in err[:-1])
