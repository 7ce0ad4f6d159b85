"""After the fastest shapes at their default split, the job search plans long shots: the
shapes an uneven split might make faster than the best planned
(ppsim.job.choice.reachable_ms). A shape whose even default split overloads one rank (a
heavy head on the last) ranks low there, yet is the one an uneven split helps most."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from ppsim.cli.flags import config_from_args
from ppsim.cli.jobplan import job_plan_dict, long_shots_text, print_job_plan
from ppsim.cli.main import build_parser
from ppsim.config.schema import config_from_dict
from ppsim.costs.model import least_busy_ms
from ppsim.job import search
from ppsim.job.choice import reachable_ms
from ppsim.job.search import JobSearch, _plan_splits, search_job
from ppsim.job.walk import silent
from ppsim.pipeline.problem import build_problem, model_costs

BUDGET_S = 20
"""The gpt-oss searches' budget: room for the long shots at a third of a core (the
test command's three workers on two), and one budget for the searches compared."""


@pytest.fixture(scope="module")
def gpt_oss_search() -> JobSearch:
    """The search `ppsim plan` runs for gpt-oss-120b on 64 GPUs (long shots planned)."""
    return search_job(_gpt_oss_cfg(), 64, 256, budget_s=BUDGET_S)


@pytest.fixture(scope="module")
def gpt_oss_plan(gpt_oss_search: JobSearch) -> dict:
    """`ppsim plan --json` of that search."""
    return json.loads(json.dumps(job_plan_dict(gpt_oss_search, 64, 256, 5)))


def _gpt_oss_cfg():
    return config_from_args(build_parser().parse_args(
        ["plan", "--preset", "gpt-oss-120b", "--hardware", "h100-80gb"]))


def test_the_search_finds_the_shape_an_uneven_split_helps_most(gpt_oss_plan: dict) -> None:
    """gpt-oss-120b's 201,088-word head weighs on the last of 8 stages at the even split,
    so pp 8 ranked below pp 4 with 4 chunks a rank, and only the latter's kind were
    planned; the search answered tp1 ep16 pp4 vpp4 at 2,045 ms."""
    res = gpt_oss_plan
    best = res["best"]
    assert (best["pp"], best["vpp"]) == (8, 1)
    assert best["split_planned"] and best["long_shot"]
    assert res["long_shots"] >= 1
    split = best["split"]
    assert split[-1] < max(split)  # the head's stage holds fewer layers than the fullest
    pp4 = [c for c in res["candidates"] if c["pp"] == 4]
    assert all(best["iteration_time_ms"] < c["iteration_time_ms"] for c in pp4)


def test_the_plan_says_what_the_long_shots_came_to(gpt_oss_search: JobSearch, capsys) -> None:
    print_job_plan(gpt_oss_search, 64, 256, 5, 80e9)
    out = capsys.readouterr().out
    said = re.search(r"(\d+) long shots? planned \(.*?\): (the best is one|none beat the "
                     r"best)", " ".join(out.split()))
    assert said is not None and int(said[1]) >= 1
    assert said[2] == "the best is one"


def _gpt_oss(pp: int, microbatches: int, vpp: int = 1) -> SimpleNamespace:
    cfg = config_from_dict({"model": {"preset": "gpt-oss-120b", "micro_batch_size": 1},
                            "pipeline": {"pp": pp, "vpp": vpp, "microbatches": microbatches,
                                         "schedule": "interleaved-1f1b" if vpp > 1 else "1f1b"},
                            "hardware": {"preset": "h100-80gb"}})
    problem = build_problem(cfg, model_costs(cfg))
    summary = SimpleNamespace(iteration_time_ms=1000.0, fits=True)
    return SimpleNamespace(problem=problem, summary=summary,
                           shape=SimpleNamespace(pp=pp, microbatches=microbatches))


def _least_fullest(pieces: list[float], parts: int) -> float:
    """The least fullest run over every contiguous cut, by dynamic programming."""
    best = {(0, 0): 0.0}
    for j in range(1, parts + 1):
        for i in range(len(pieces) + 1):
            best[(i, j)] = min(max(best[(k, j - 1)], sum(pieces[k:i]))
                               for k in range(i + 1) if (k, j - 1) in best)
    return best[(len(pieces), parts)]


def test_reach_takes_off_what_evening_the_busiest_rank_saves_every_microbatch() -> None:
    r = _gpt_oss(8, 16)
    costs = r.problem.costs
    emb, head = least_busy_ms(costs.embedding), least_busy_ms(costs.head)
    layers = [least_busy_ms(c) for c in costs.layers]
    works = [sum(layers[st.offset:st.offset + st.layers]) + emb * st.has_embedding
             + head * st.has_head for st in r.problem.split.stages]
    assert works.index(max(works)) == 7  # the even split overloads the head's rank
    even = _least_fullest([emb, *layers, head], 8)
    assert 1000.0 - reachable_ms(r) == pytest.approx(16 * (max(works) - even), rel=1e-9)


def test_a_single_stage_or_interleaved_shape_keeps_its_default_time() -> None:
    assert reachable_ms(_gpt_oss(1, 4)) == 1000.0  # one rank: nothing to even out
    assert reachable_ms(_gpt_oss(4, 8, vpp=2)) == 1000.0


def test_only_the_long_shots_the_budget_left_time_for_count_as_planned() -> None:
    """Before: every long shot chosen was marked planned, those the spent budget skipped
    too (at their default split, as the table then said of them)."""

    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb"]))
    shapes = search_job(cfg, 16, 32, budget_s=3).candidates[:2]
    skipped = _plan_splits(cfg, shapes, 32, "", 10.0, time.perf_counter() - 100, silent,
                           as_long_shots=True)
    assert not any(r.long_shot for r in skipped)
    assert [r.problem.split for r in skipped] == [r.problem.split for r in shapes]
    planned = _plan_splits(cfg, shapes, 32, "", 10.0, time.perf_counter(), silent,
                           as_long_shots=True)
    assert all(r.long_shot for r in planned)


def test_long_shots_only_add_plans_and_here_a_faster_one(gpt_oss_plan: dict) -> None:
    without = search_job(_gpt_oss_cfg(), 64, 256, budget_s=BUDGET_S, shots=False)
    assert without.long_shots == 0 and not any(r.long_shot for r in without.candidates)
    best_without = next(r for r in without.candidates if r.summary.fits)
    with_ = gpt_oss_plan["best"]
    assert with_["long_shot"]
    assert with_["iteration_time_ms"] < best_without.summary.iteration_time_ms
    # the walk simulates the same shapes either way; long shots the walk bounded out
    # (ppsim.job.search._bounded_out) are simulated after it
    assert gpt_oss_plan["evaluated"] >= without.evaluated


def test_long_shots_the_budget_ran_out_before_are_counted_and_said(monkeypatch) -> None:
    """Before, a search whose budget ran out before its long shots said nothing of them:
    the same command could answer a slower shape on a slower machine without a word."""

    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb"]))
    # Two long shots chosen, and none of the budget left for them.
    monkeypatch.setattr(search, "long_shots", lambda results, *_, **__: results[:2])
    monkeypatch.setattr(search, "SHOTS_SPARE", 1.0)
    res = search.search_job(cfg, 16, 32, budget_s=3)
    assert (res.long_shots, res.long_shots_unplanned) == (0, 2)
    best = next(r for r in res.candidates if r.summary.fits)
    said = " ".join(long_shots_text(res, best).split())
    assert said.startswith("2 long shots (shapes an uneven split might make faster")
    assert "not planned: the time budget ran out before them; --time-budget 12 may find" in said
    assert job_plan_dict(res, 16, 32, 3)["long_shots_unplanned"] == 2
    both = " ".join(long_shots_text(replace(res, long_shots=1, long_shots_unplanned=1),
                                    best).split())
    assert re.fullmatch(r"1 long shot planned \(.*\): none beat the best; 1 long shot not "
                        r"planned: the time budget ran out before it; --time-budget 12 may "
                        r"find a faster shape", both)
