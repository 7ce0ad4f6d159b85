"""The job search's walk bounds a shape out by its default split's busiest rank
(Pending.bound_ms); a shape whose default split overloads one rank (DeepSeek-V3's
embedding and MTP head on pp 32) is bounded out there, though an uneven split may make
it the fastest. Its split-free bound (Pending.least_ms) lets the search simulate it and
plan it as a long shot."""

from __future__ import annotations

import pytest

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.job.pending import pending_shape
from ppsim.job.search import JobSearch, search_job
from ppsim.job.shapes import Shape

GPUS, GBS = 2048, 15360
BEST_MS = 32_976.0
"""`ppsim plan --gpus 2048` of DeepSeek-V3 under FSDP: tp2 cp2 ep16 pp16, its split
planned."""


def _cfg():
    return config_from_args(build_parser().parse_args(
        ["plan", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--fsdp"]))


@pytest.fixture(scope="module")
def held_search() -> JobSearch:
    """The search with tp 2 and cp 2 held (about 300 shapes)."""
    return search_job(_cfg(), GPUS, GBS, budget_s=20, fixed={"tp": 2, "cp": 2})


def test_the_split_free_bound_sees_past_the_default_split() -> None:
    """tp4 ep8 pp32: its default split's busiest rank bounds it above the best planned
    time, but no split is bounded so: an uneven one plans it at 30,775 ms."""
    shape = Shape(tp=4, cp=1, ep=8, pp=32, dp=16, vpp=1, mbs=1, microbatches=960)
    p = pending_shape(_cfg(), shape, GBS)
    assert p.bound_ms > BEST_MS > p.least_ms
    assert p.least_ms <= 30_775.0  # a bound on any split: below the planned time


def test_interleaved_shapes_keep_their_default_bound() -> None:
    """With several chunks a rank, a contiguous run is no bound: least_ms is bound_ms."""
    shape = Shape(tp=2, cp=2, ep=32, pp=8, dp=64, vpp=4, mbs=1, microbatches=240)
    p = pending_shape(_cfg(), shape, GBS)
    assert p.least_ms == p.bound_ms


def test_a_bounded_out_shape_is_planned_as_a_long_shot(held_search: JobSearch) -> None:
    """tp2 cp2 ep16 pp32's default split (39,864 ms) is bounded out by the walk, yet its
    split-free bound is below the best planned: the search simulates it and plans it."""
    shot = [c for c in held_search.candidates
            if c.shape.label() == "tp2 cp2 ep16 etp1 pp32 dp16 vpp1 mbs1 m960"]
    assert len(shot) == 1 and shot[0].long_shot
    assert held_search.long_shots >= 1
    assert held_search.seconds < 20  # within the budget
