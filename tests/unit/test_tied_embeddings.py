"""Tied embeddings: the LM head's weight is the embedding's table. A stage that holds
both keeps one table (Megatron's single shared weight when pp = 1); with the ends on two
stages each keeps its copy and the two reduce its gradient (tests/unit/test_job_comm.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.plan.search import SplitSearch
from ppsim.sim.simulate import simulate

TABLE = 50304 * 2048
"""gpt3-1.3b's table: GPT-2's 50,257 tokens padded to a multiple of 128 x hidden 2,048."""
BYTES_PER_PARAM = 2 + 4 + 12
"""Megatron's mixed precision without the distributed optimizer: a bf16 weight, a fp32
gradient, Adam's fp32 master weight, momentum and variance."""


def problem(tied: bool, pp: int, split: list[int] | None = None, policy: bool = False):
    pipeline = {"pp": pp, "microbatches": 4, **({"split": split} if split else {})}
    data = {"model": {"preset": "gpt3-1.3b", "tie_embeddings": tied},
            "pipeline": pipeline, "hardware": {"preset": "h100-80gb"}}
    if policy:
        data["memory"] = {"recompute_modules": ["core_attn"],
                          "stage": [{"stage": 0, "recompute_layers": 3}]}
    return build_problem(config_from_dict(data))


def test_one_stage_holds_a_tied_table_once() -> None:
    untied, tied = problem(False, 1), problem(True, 1)
    a, b = untied.stage_costs[0], tied.stage_costs[0]
    assert a.params - b.params == TABLE
    assert a.static_bytes - b.static_bytes == TABLE * BYTES_PER_PARAM
    peaks = [simulate(p).summary.peak_memory_bytes for p in (untied, tied)]
    assert peaks[0] - peaks[1] == TABLE * BYTES_PER_PARAM
    # The head's matmul runs all the same: time does not change.
    assert (a.forward_ms, a.backward_ms) == (b.forward_ms, b.backward_ms)


def test_two_stages_each_keep_their_copy() -> None:
    for a, b in zip(problem(False, 2).stage_costs, problem(True, 2).stage_costs, strict=True):
        assert (a.params, a.static_bytes) == (b.params, b.static_bytes)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 2), st.integers(1, 23), st.booleans(), st.booleans())
def test_the_planner_prices_each_stage_as_the_cost_model(pp: int, cut: int, tied: bool,
                                                         policy: bool) -> None:
    """The planner's O(1) stage bytes (prefix sums; a memory policy's own) equal the
    cost model's sum for every stage, tied or not, one stage or two."""
    p = problem(tied, pp, [cut, 24 - cut] if pp == 2 else None, policy)
    search = SplitSearch(p)
    for st_, cost in zip(p.split.stages, p.stage_costs, strict=True):
        static, _, _ = search.stage_bytes(st_.offset, st_.layers, st_.index)
        assert static == cost.static_bytes


def test_a_v_schedule_with_a_tied_table_is_refused_and_the_planner_skips_it(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """ZB-V (or one rank with two stages) puts the embedding and the head on rank 0: one
    table on two stages of a rank is not modelled, so simulate refuses it (exit 2, one line
    naming the field) and a plan searching schedules keeps to the loop ones."""
    cfg = tmp_path / "tied.toml"
    cfg.write_text('[model]\npreset = "gpt3-1.3b"\ntie_embeddings = true\n'
                   '[pipeline]\npp = 2\nmicrobatches = 8\n[hardware]\npreset = "h100-80gb"\n')
    for flags in (["--schedule", "zbv", "--vpp", "2"],  # stages 0 and 3 on rank 0
                  ["--pp", "1", "--vpp", "2", "--schedule", "interleaved-1f1b"]):
        assert main(["simulate", "--config", str(cfg), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "model.tie_embeddings" in err[0] and "rank 0" in err[0]

    def variants(tied: bool) -> list[str]:
        cfg.write_text(cfg.read_text().replace(f"tie_embeddings = {str(not tied).lower()}",
                                               f"tie_embeddings = {str(tied).lower()}"))
        assert main(["plan", "--config", str(cfg), "--search", "schedule,vpp",
                     "--time-budget", "1", "--json"]) == 0
        return [v["variant"] for v in json.loads(capsys.readouterr().out)["variants"]]

    tied, untied = variants(True), variants(False)
    assert {"zbv vpp=2 m=8", "dualpipev vpp=2 m=8"} <= set(untied)
    assert set(tied) == set(untied) - {"zbv vpp=2 m=8", "dualpipev vpp=2 m=8"}
