"""The shapes the walk bounded out, simulated as long shot candidates
(ppsim.job.walk.bounded_out_shots): lowest split-free bound first, until k of them
promise to beat the best planned time (ppsim.job.choice.promises)."""

from __future__ import annotations

import math
import time

import pytest

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.job.choice import promises, reachable_ms
from ppsim.job.pending import Pending, pending_shape
from ppsim.job.shapes import shapes
from ppsim.job.walk import bounded_out_shots, silent, simulate_shapes

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
