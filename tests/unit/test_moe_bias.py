"""Biased linears in an MoE model: Megatron's default (add_bias_linear) unless
--disable-bias-linear. Its TransformerConfig asserts "Bias in Moe is only supported when
ETP==1" and SharedExpertMLP refuses biases, so ppsim refuses those lines (exit 2, one
line naming the flags), and the job search proposes such a model only at etp 1."""

from __future__ import annotations

import json
import shlex

import pytest

from ppsim.cli.main import main
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.model import parse_model

MOE = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
       "--vocab-size 32000 --bf16 --swiglu --num-experts 8 --moe-router-topk 2 "
       "--moe-ffn-hidden-size 512 --sequence-parallel --hardware h100-80gb")
"""An MoE model built from Megatron's flags alone, no --disable-bias-linear."""


def _run(argv: str, capsys) -> tuple[int, str, str]:
    code = main(shlex.split(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("extra", "where", "words"), [
    ("--tensor-model-parallel-size 2", "model.tp", "Bias in Moe is only supported when ETP==1"),
    ("--tp 2 --expert-tensor-parallel-size 2", "model.etp", "ETP==1"),
    ("--expert-tensor-parallel-size 2", "model.etp", "ETP==1"),
    ("--moe-shared-expert-intermediate-size 512", "model.linear_bias",
     "bias is not supported in the shared experts"),
])
def test_biased_experts_megatron_refuses_are_refused(extra, where, words, capsys) -> None:
    code, _, err = _run(f"simulate {MOE} {extra}", capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert f"error: {where}:" in lines[0] and words in lines[0]
    assert "--disable-bias-linear" in lines[0]


@pytest.mark.parametrize("extra", [
    "--tensor-model-parallel-size 2 --disable-bias-linear",
    "--tensor-model-parallel-size 2 --expert-tensor-parallel-size 1",
    "--moe-shared-expert-intermediate-size 512 --disable-bias-linear",
    "",  # tp 1: etp 1
])
def test_what_megatron_accepts_is_priced(extra, capsys) -> None:
    code, out, err = _run(f"simulate {MOE} {extra} --json", capsys)
    assert code == 0, err
    assert json.loads(out)["iteration_time_ms"] > 0


def test_a_config_with_biased_linears_is_refused_at_etp_above_one(tmp_path, capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "mixtral-8x7b"\nlinear_bias = true\ntp = 2\n'
                    "ep = 8\netp = 2\ndp = 8\n[pipeline]\npp = 1\n")
    assert main(["simulate", "--config", str(path), "--hardware", "h100-80gb"]) == 2
    err = capsys.readouterr().err
    assert "model.etp" in err and "ETP==1" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("bias", "folded_only"), [("", True), ("--disable-bias-linear", False)])
def test_the_job_search_splits_no_biased_expert(bias, folded_only, capsys) -> None:
    code, out, err = _run(f"plan {MOE} {bias} --gpus 8 --global-batch-size 16 "
                          "--time-budget 30 --top 200 --json", capsys)
    assert code in (0, 3), err
    cands = json.loads(out)["candidates"]
    assert any(c["tp"] > 1 for c in cands)
    assert all(c["etp"] == 1 for c in cands) is folded_only


def test_a_presets_megatron_arguments_say_its_linears_have_no_bias() -> None:
    """Megatron's default adds biases, so the inverse of its flags says it has none."""
    mixtral = parse_model({"preset": "mixtral-8x7b"}).arch
    assert "--disable-bias-linear" in megatron_model_args(mixtral)
