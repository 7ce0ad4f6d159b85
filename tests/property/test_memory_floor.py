"""The planner's memory floor (SplitSearch.floor) is a lower bound on the fullest rank's
peak under every split, checked by simulating every split; above the limit the planner
answers at once that nothing fits, and the advice says what can help."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from helpers import every_split, uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.model import LayerCost
from ppsim.pipeline.problem import build_problem
from ppsim.plan.advice import no_fit_message
from ppsim.plan.floor import held_microbatches
from ppsim.plan.planner import plan
from ppsim.plan.search import SplitSearch
from ppsim.schedules.generators import build_schedule

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zbv", 2),
             ("dualpipev", 2), ("interleaved-zb", 2)]


@st.composite
def mixed_problems(draw):
    """Small pipelines whose layers differ in static and activation bytes (dense and MoE
    stacks do), under every schedule family, with memory limits around their peaks; some
    tie a table of the embedding's and the head's (one on a rank holding both ends)."""
    name, vpp = draw(st.sampled_from(SCHEDULES))
    pp = 2 if vpp == 2 else draw(st.integers(1, 4))
    m = draw(st.integers(4 if name in ("zbv", "dualpipev") else 1, 6))
    layers = draw(st.integers(pp * vpp, 7))
    problem = uniform_problem(
        pp, vpp, m, name, counts=[layers] + [0] * (pp * vpp - 1), wg=40,
        head={"activation_bytes": draw(st.integers(0, 800)), "static_bytes": 900,
              "transient_bytes": draw(st.sampled_from([0, 600]))},
        emb={"static_bytes": draw(st.integers(0, 2000)),
             "activation_bytes": draw(st.integers(0, 300))},
        memory=draw(st.sampled_from([1e12, 3000.0, 6000.0, 12000.0])))
    sizes = st.tuples(st.integers(0, 3000), st.integers(0, 400), st.sampled_from([0, 0, 500]))
    kinds = [draw(sizes) for _ in range(layers)]
    table = draw(st.integers(0, min(900, problem.costs.embedding.static_bytes)))
    costs = replace(problem.costs, tied=LayerCost(static_bytes=table), layers=tuple(
        replace(c, static_bytes=s, activation_bytes=a, transient_bytes=t)
        for c, (s, a, t) in zip(problem.costs.layers, kinds, strict=True)))
    return replace(problem, costs=costs)


@settings(max_examples=80, deadline=None)
@given(mixed_problems())
def test_the_floor_is_below_every_splits_fullest_rank(problem):
    floor = SplitSearch(problem).floor
    summaries = [s for _, s in every_split(problem)]
    assert floor.static_bytes <= min(max(r.static_bytes for r in s.ranks) for s in summaries)
    assert floor.peak_bytes <= min(s.peak_memory_bytes for s in summaries)
    if floor.peak_bytes > problem.hardware.memory_bytes:  # the planner's shortcut is sound
        assert not any(s.fits for s in summaries)
        res = plan(problem)
        assert res.best is None and res.evaluated <= 1 and res.floor == floor


@settings(max_examples=60, deadline=None)
@given(mixed_problems(), st.data())
def test_a_partial_splits_floor_is_below_every_completion(problem, data):
    """What the planner cuts a branch by: no completion of the placed stages fits below
    SplitSearch.floors.completion (checked against every completion, simulated)."""
    search = SplitSearch(problem)
    results = every_split(problem)
    k = data.draw(st.integers(1, search.S - 1)) if search.S > 1 else 1
    counts, _ = data.draw(st.sampled_from(results))
    prefix = counts[:k]
    placed, pos = [], 0
    for i, n in enumerate(prefix):
        placed.append(search.stage(pos, n, i))
        pos += n
    bound = search.floors.completion(placed, pos)
    peaks = [s.peak_memory_bytes for c, s in results if c[:k] == prefix]
    assert bound <= min(peaks) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(mixed_problems())
def test_held_counts_are_the_memory_records_least_chunk_count_at_its_fullest(problem):
    """held_microbatches reads the order once, by itself; it equals what the planner's
    memory records (one per op start, counts per chunk) give, and a rebuilt order with
    the same recipe reads the kept counts."""
    search = SplitSearch(problem)
    by_records = tuple(max((min(rec[:search.vpp]) for rec in recs), default=0)
                       for recs in search.patterns)
    sched = problem.schedule
    assert held_microbatches(sched) == by_records
    if sched.recipe is not None:
        again = build_schedule(*sched.recipe)
        assert again.actions == sched.actions
        assert held_microbatches(again) == by_records


def test_uniform_layers_make_the_floor_tight():
    """One chunk a rank, layers that all cost alike: the floor is the even spread's."""
    problem = uniform_problem(2, 1, 4, "gpipe", counts=[8, 0], act=100, static=1000,
                              head={"static_bytes": 0}, emb={"static_bytes": 0})
    floor = SplitSearch(problem).floor
    assert floor.inflight == (4, 4)  # GPipe holds every microbatch on every rank
    assert floor.static_bytes == 4 * 1000
    assert floor.peak_bytes == pytest.approx(4 * (1000 + 4 * 100), abs=1)
    assert min(s.peak_memory_bytes for _, s in every_split(problem)) == 4 * (1000 + 400)


def _deepseek(vpp: int, time_budget: str = "2") -> list[str]:
    return ["plan", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--pp", "8",
            "--vpp", str(vpp), "--time-budget", time_budget]


def test_a_plan_that_cannot_fit_says_so_without_searching(capsys) -> None:
    """DeepSeek-V3 at pp 8 with two chunks a rank on 80 GB: every split holds over 90
    GB on some rank. The search once spent its whole budget and then advised a longer
    one ("no split ... was found within the time budget")."""
    cfg = config_from_dict({"model": {"preset": "deepseek-v3"},
                            "pipeline": {"pp": 8, "vpp": 2, "microbatches": 8,
                                         "schedule": "interleaved-1f1b"},
                            "hardware": {"preset": "h100-80gb"}})
    res = plan(build_problem(cfg), time_budget_s=2.0)
    assert res.best is None and res.evaluated == 1  # the even split, for its own row
    assert res.floor is not None and res.floor.peak_bytes > 90e9
    text = no_fit_message(res)
    assert "time budget" not in text and "holds at least" in text
    assert main(_deepseek(2)) == 3
    err = capsys.readouterr().err
    assert "time budget" not in err and "activation recompute" in err


def test_state_over_the_limit_points_at_sharding_not_recompute(capsys) -> None:
    """Qwen3-Next on two stages: its weights and Adam state alone exceed 80 GB a rank,
    which no recompute, micro-batch or time budget changes."""
    argv = ["plan", "--preset", "qwen3-next-80b-a3b", "--hardware", "h100-80gb", "--vpp", "4",
            "--seq-length", "64"]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "recompute cannot help" in err and "(--pp 3 at the least)" in err
    assert "--recompute selective" not in err
    assert main([*argv, "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["best"] is None and out["evaluated"] == 1
    assert out["memory_floor"]["static_bytes"] > 80e9


@pytest.mark.parametrize(("argv", "said"), [
    (["--preset", "llama3-8b", "--pp", "4", "--seq-length", "512", "--memory-gb", "39",
      "--microbatches", "16"], "another split may fit: `ppsim plan` finds the fastest"),
    (["--preset", "qwen3-next-80b-a3b", "--seq-length", "64"],
     "no split fits: weights, gradients and optimizer state alone leave at least 110."),
    (["--preset", "deepseek-v3", "--pp", "8", "--vpp", "2"],
     "no split fits: some rank of 8 holds at least "),
])
def test_simulate_says_whether_another_split_could_fit(argv, said, capsys) -> None:
    """A simulated split that does not fit says whether any split could, by the floor."""
    assert main(["simulate", *argv, "--hardware", "h100-80gb"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as one line, however Rich wraps it
    assert "does NOT fit" in out and said in out
    floor = re.search(r"at least ([\d.]+) GB", out)
    assert floor is None or float(floor.group(1)) > 80  # over the h100-80gb limit
    assert main(["simulate", *argv, "--hardware", "h100-80gb", "--json"]) == 0
    assert said in json.loads(capsys.readouterr().out)["fit_hint"]


def test_an_order_without_its_actions_has_no_held_counts() -> None:
    """The TUI's child sends its parent the schedule without its actions: counting that
    would read (and keep, by its recipe) a floor of nothing held."""
    s = build_schedule("1f1b", 4, 1, 8)
    with pytest.raises(ValueError, match="actions for 0 ranks, not its 4"):
        held_microbatches(replace(s, actions=()))
    assert held_microbatches(s) == (4, 3, 2, 1)
