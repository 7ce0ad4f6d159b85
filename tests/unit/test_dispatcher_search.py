"""`ppsim plan --gpus N --search dispatcher`: each MoE shape tried with the all-to-all
dispatcher and with DeepEP (where its tp x ep group has more than one rank), the best
of both kept, said in the table, the JSON and Megatron's flags."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.job.search import search_job
from ppsim.job.shapes import Shape, dispatcher_choices

QWEN = {"model": {"preset": "qwen3-235b-a22b", "num_layers": 4},
        "hardware": {"preset": "h100-80gb"}}


def _best(dispatcher: str | None, search: bool = False) -> tuple[float, str]:
    cfg = config_from_dict({**QWEN, "pipeline": {"pp": 1, "moe_token_dispatcher_type":
                                                 dispatcher or "alltoall"}})
    res = search_job(cfg, 16, 64, top_k=3, budget_s=120,
                     axes=frozenset({"dispatcher"} if search else ()))
    assert res.complete
    best = next(r for r in res.candidates if r.summary.fits)
    return best.summary.iteration_time_ms, best.problem.hardware.job.moe_token_dispatcher_type


def test_the_dispatcher_search_keeps_the_faster_of_both() -> None:
    a2a, _ = _best("alltoall")
    flex, _ = _best("flex")
    both, kind = _best(None, search=True)
    assert both == pytest.approx(min(a2a, flex), rel=1e-9)
    assert kind == ("flex" if flex < a2a else "alltoall")


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]))
def test_deepep_is_tried_where_its_group_has_more_than_one_rank(tp: int, ep: int) -> None:
    s = Shape(tp=tp, cp=1, ep=ep, pp=1, dp=8, vpp=1, mbs=1, microbatches=4)
    kinds = [v.dispatcher for v in dispatcher_choices(s)]
    assert kinds == (["alltoall", "flex"] if tp * ep > 1 else ["alltoall"])
    assert all(v.tp == tp and v.ep == ep for v in dispatcher_choices(s))


def test_the_table_json_and_flags_name_the_dispatcher(capsys) -> None:
    argv = ["plan", "--preset", "qwen3-235b-a22b", "--num-layers", "4", "--hardware",
            "h100-80gb", "--gpus", "32", "--global-batch-size", "128", "--search",
            "dispatcher", "--top", "6"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    kinds = {c["moe_token_dispatcher_type"] for c in doc["candidates"]}
    assert kinds <= {"alltoall", "flex"} and doc["best"]["moe_token_dispatcher_type"] in kinds
    flag = f"--moe-token-dispatcher-type {doc['best']['moe_token_dispatcher_type']}"
    assert flag in doc["best"]["megatron_job_flags"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (" deepep" in out) or (" a2a" in out)


def test_a_dense_model_has_no_dispatcher_to_search(capsys) -> None:
    assert main(["plan", "--preset", "llama3-8b", "--gpus", "16", "--global-batch-size", "64",
                 "--search", "dispatcher"]) == 2
    err = capsys.readouterr().err
    assert "--search: dispatcher: the model has no routed experts" in err
    assert len(err.strip().splitlines()) == 1


def test_deepep_at_ep_1_is_still_named_in_megatrons_flags() -> None:
    """Megatron's flex dispatcher runs over tp x ep, so at ep 1 and tp 2 the flags still
    choose it (Megatron's default would gather instead); the all-to-all needs ep > 1."""
    from ppsim.cli.megatron_args import parallel_args
    assert "--moe-token-dispatcher-type flex" in " ".join(parallel_args(2, 1, 1, "flex"))
    assert "--moe-token-dispatcher-type" not in " ".join(parallel_args(2, 1, 1, "alltoall"))
    assert "--moe-token-dispatcher-type alltoall" in " ".join(parallel_args(2, 1, 4))
