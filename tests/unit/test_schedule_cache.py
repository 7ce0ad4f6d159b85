"""build_schedule keeps the latest orders it generated (a job search builds thousands of
shapes over a few dozen): an equal recipe returns the same immutable order, a refused
argument is refused however an equal-valued one was cached, and what is kept stays
within KEPT_ACTIONS."""

from __future__ import annotations

import pytest

from ppsim.errors import UserError
from ppsim.schedules import generators
from ppsim.schedules.generators import build_schedule


def test_an_equal_recipe_returns_the_kept_order() -> None:
    first = build_schedule("interleaved-1f1b", 4, 2, 8)
    assert build_schedule("interleaved-1f1b", 4, 2, 8) is first
    assert build_schedule("interleaved-1f1b", 4, 2, 8, combined=True) is not first
    assert build_schedule("interleaved-1f1b", 4, 2, 12).microbatches == 12


def test_a_bool_is_refused_where_its_int_was_kept() -> None:
    build_schedule("1f1b", 1, 1, 4)
    with pytest.raises(UserError, match="pipeline.pp: must be a positive integer, got True"):
        build_schedule("1f1b", True, 1, 4)


def test_what_is_kept_stays_within_its_bound(monkeypatch) -> None:
    monkeypatch.setattr(generators, "KEPT_ACTIONS", 2_000)
    monkeypatch.setattr(generators, "_kept", type(generators._kept)())
    for m in range(8, 200, 16):  # 4 ranks x 2 x m actions each
        build_schedule("1f1b", 4, 1, m)
        kept = list(generators._kept.values())
        assert len(kept) == 1 or sum(generators._size(s) for s in kept) <= 2_000
    # 1,472 actions at m = 184: the one before it (1,344) no longer fits beside it
    assert [s.microbatches for s in generators._kept.values()] == [184]
    build_schedule("1f1b", 4, 1, 8)  # 64 actions fit beside it, the latest last
    assert [s.microbatches for s in generators._kept.values()] == [184, 8]
