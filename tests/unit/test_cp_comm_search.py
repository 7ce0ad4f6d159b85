"""`plan --gpus --search cp-comm`: the job search tries each context-parallel traffic on
the shapes with cp > 1 (the Ulysses all-to-alls only where cp divides a tensor rank's
query and key/value heads), names it in the table and the JSON, and exports it."""

from __future__ import annotations

import json

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.job.search import search_job
from ppsim.job.shapes import Shape, cp_comm_choices

ARCH = config_from_dict({"model": {"preset": "llama3-8b"}}).model.arch  # 32 / 8 heads


def _shape(tp: int, cp: int) -> Shape:
    return Shape(tp=tp, cp=cp, ep=1, pp=1, dp=1, vpp=1, mbs=1, microbatches=1)


@pytest.mark.parametrize("tp, cp, kinds", [
    (1, 1, [""]),  # nothing to choose
    (1, 2, ["p2p", "all_gather", "a2a"]),
    (4, 2, ["p2p", "all_gather", "a2a"]),  # 8 and 2 heads a tensor rank
    # 2 key/value heads do not split four ways; two ranks a node, the all-to-all between
    # them, the ring across the nodes
    (4, 4, ["p2p", "all_gather", "a2a+p2p"]),
    (8, 2, ["p2p", "all_gather"]),
])
def test_the_choices(tp: int, cp: int, kinds: list[str]) -> None:
    assert [s.cp_comm for s in cp_comm_choices(_shape(tp, cp), ARCH)] == kinds


def test_the_label() -> None:
    s = cp_comm_choices(_shape(1, 2), ARCH)[2]
    assert s.label().endswith(" cp-a2a")


def test_the_search_times_each_traffic() -> None:
    cfg = config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 8,
                                      "seq_length": 16384},
                            "hardware": {"preset": "h100-80gb"}})
    res = search_job(cfg, 16, 32, top_k=3, budget_s=60, fixed={"tp": 2, "cp": 2, "pp": 1},
                     axes=frozenset({"cp-comm"}))
    kinds = {r.problem.hardware.job.arch.cp_comm_type for r in res.candidates}
    assert kinds == {"p2p", "all_gather", "a2a"}
    # The ring hides behind the attention; the others wait: it comes first.
    assert res.candidates[0].problem.hardware.job.arch.cp_comm_type == "p2p"


def test_the_plan_says_it(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16",
            "--global-batch-size", "32", "--tp", "2", "--cp", "2", "--pp", "1",
            "--seq-length", "16384", "--micro-batch-size", "1", "--recompute", "full",
            "--search", "cp-comm", "--time-budget", "30"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {c["cp_comm_type"] for c in doc["candidates"]} == {"p2p", "all_gather", "a2a"}
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "cp-all_gather" in out or "cp-a2a" in out


def test_without_gpus_it_is_the_job_searchs(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--preset", "llama3-8b", "--search", "cp-comm"])
    err = capsys.readouterr().err
    assert code == 2 and "'cp-comm' is an axis of the job search (--gpus)" in err
