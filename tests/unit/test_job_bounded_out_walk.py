"""The shapes the walk bounded out, simulated as long shot candidates
(ppsim.job.walk.bounded_out_shots): lowest split-free bound first, until k of them
promise to beat the best planned time (ppsim.job.choice.promises), passing over those
whose reach is bounded above it before they are simulated."""

from __future__ import annotations

import math
import time

import pytest

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.job.choice import least_reach_ms, promises, reachable_ms
from ppsim.job.pending import Pending, pending_shape
from ppsim.job.shapes import shapes
from ppsim.job.walk import bounded_out_shots, silent, simulate_shapes
from ppsim.pipeline.problem import build_problem
from ppsim.plan.floor import memory_floors

GBS = 32


@pytest.fixture(scope="module")
def pending() -> list[Pending]:
    """Llama 3 8B, 8 layers, on 16 GPUs: its shapes of one chunk a rank over 2 and 4
    stages (each fits at its default split)."""
    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb"]))
    todo = [s for s in shapes(cfg.model.arch, 16, GBS, 8, cfg.model.total_layers)
            if s.vpp == 1 and s.pp in (2, 4)]
    return [pending_shape(cfg, s, GBS) for s in todo]


def _reach(p: Pending) -> float:
    r = simulate_shapes([p], lambda q: q, "", 1, 0.0, time.perf_counter(), silent).results
    return reachable_ms(r[0])


def _shots(pending: list[Pending], best_ms: float, k: int) -> list:
    return bounded_out_shots(pending, lambda q: q, best_ms, k, "", False,
                             time.perf_counter() + 60, silent)


def test_shapes_that_promise_nothing_do_not_use_up_the_k(pending: list[Pending]) -> None:
    """Before, the k lowest bounds were simulated whatever they promised; at a best no
    shape's reach is under, every shape whose bound is under it is simulated."""
    best = min(_reach(p) for p in pending)
    under = [p for p in pending if p.least_ms < best]
    assert len(under) > 1
    out = _shots(pending, best, k=1)
    assert sorted(r.shape.label() for r in out) == sorted(p.shape.label() for p in under)
    assert not any(promises(r, best) for r in out)


def test_k_shapes_that_promise_end_it(pending: list[Pending]) -> None:
    out = _shots(pending, math.inf, k=2)
    assert len(out) == 2 and all(promises(r, math.inf) for r in out)
    lowest = sorted(pending, key=lambda p: p.least_ms)[:2]
    assert [r.shape for r in out] == [p.shape for p in lowest]


@pytest.fixture(scope="module")
def tight() -> list[Pending]:
    """Llama 3 8B, 6 layers, on 8 GPUs with 20 GB each: memory keeps the split of many
    shapes from evening out their ranks."""
    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "llama3-8b", "--num-layers", "6", "--hardware", "h100-80gb",
         "--memory-gb", "20"]))
    todo = [s for s in shapes(cfg.model.arch, 8, GBS, 8, cfg.model.total_layers)
            if s.vpp == 1 and s.pp > 1]
    return [pending_shape(cfg, s, GBS) for s in todo]


def test_a_shape_whose_reach_is_bounded_above_the_best_is_not_simulated(
        tight: list[Pending]) -> None:
    """Its reach cannot come under the best (least_reach_ms, memory counted), though its
    split-free bound (memory ignored) does: no simulation can make it a long shot."""
    def least_reach(p: Pending) -> float:
        return least_reach_ms(build_problem(p.cfg, p.costs), p.shape.pp, p.shape.microbatches)

    best = sorted(least_reach(p) for p in tight)[len(tight) // 2]
    hopeless = {p.shape for p in tight if p.least_ms < best <= least_reach(p)
                and _fits_some_split(p)}
    assert hopeless
    out = _shots(tight, best, k=len(tight))
    assert out and not hopeless & {r.shape for r in out}
    assert all(least_reach(p) < best for p in tight if p.shape in {r.shape for r in out})


def _fits_some_split(p: Pending) -> bool:
    """The walk's memory floor does not pass it over."""
    problem = build_problem(p.cfg, p.costs)
    return memory_floors(problem).floor.peak_bytes <= problem.hardware.memory_bytes
