"""Megatron's router flags as its parser and TransformerConfig take them: values outside
its choices and the combinations it refuses stop the line (exit 2, the flag named), and
what it accepts prices as the model without them (ppsim's router is even)."""

from __future__ import annotations

import shlex

import pytest

from ppsim.cli.main import main

MIXTRAL = "simulate --preset mixtral-8x7b --hardware h100-80gb --pp 2 --microbatches 2"


def _run(extra: str, capsys) -> tuple[int, str]:
    try:
        code = main(shlex.split(f"{MIXTRAL} {extra} --json"))
    except SystemExit as stop:  # the parser's own refusals
        code = int(stop.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("extra", "flag", "words"), [
    # TransformerConfig: softmax over one chosen logit has no gradient
    ("--moe-router-topk 1", "--moe-router-topk", "--moe-router-pre-softmax when topk is 1"),
    ("--moe-router-topk 1 --moe-router-score-function softmax", "--moe-router-topk",
     "pre-softmax"),
    ("--moe-expert-capacity-factor 1.0 --moe-router-load-balancing-type sinkhorn",
     "--moe-router-load-balancing-type", "only works with aux_loss"),
    ("--moe-router-enable-expert-bias", "--moe-router-enable-expert-bias", "'sigmoid'"),
    ("--moe-router-group-topk 2", "--moe-router-group-topk",
     "moe_router_num_groups must be specified"),
    ("--moe-router-num-groups 3 --moe-router-group-topk 1", "--moe-router-num-groups",
     "should be divisible"),
    ("--moe-router-num-groups 4 --moe-router-group-topk 5", "--moe-router-group-topk",
     "should be smaller"),
    ("--moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 1e-2",
     "--moe-aux-loss-coeff", "same length"),
    # the parser's choices
    ("--moe-router-load-balancing-type aux", "--moe-router-load-balancing-type",
     "invalid choice"),
    ("--moe-router-score-function relu", "--moe-router-score-function", "invalid choice"),
    ("--moe-router-dtype fp16", "--moe-router-dtype", "invalid choice"),
    ("--moe-token-drop-policy random", "--moe-token-drop-policy", "invalid choice"),
])
def test_what_megatron_refuses_is_refused(extra: str, flag: str, words: str, capsys) -> None:
    code, err = _run(extra, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and flag in lines[0] and words in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("extra", [
    "--moe-router-topk 1 --moe-router-pre-softmax",
    "--moe-router-topk 1 --moe-router-score-function sigmoid",
    "--moe-router-topk 1 --moe-router-load-balancing-type sinkhorn",
])
def test_one_expert_a_token_runs_where_megatron_runs_it(extra: str, capsys) -> None:
    assert _run(extra, capsys)[0] == 0


@pytest.mark.parametrize("extra", [
    "--moe-expert-capacity-factor -1 --moe-router-load-balancing-type sinkhorn",
    "--moe-router-score-function sigmoid --moe-router-enable-expert-bias",
    "--moe-router-num-groups 4 --moe-router-group-topk 2",
    "--moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 1e-2 1e-4",
    "--moe-router-dtype fp64 --moe-token-drop-policy position",
])
def test_what_megatron_accepts_prices_the_model_unchanged(extra: str, capsys) -> None:
    assert main(shlex.split(f"{MIXTRAL} --json")) == 0
    plain = capsys.readouterr().out
    assert main(shlex.split(f"{MIXTRAL} {extra} --json")) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize(("extra", "flag"), [
    # TransformerConfig: "moe_expert_capacity_factor must be set to use
    # moe_pad_expert_input_to_capacity" (a negative factor is unset: dropless)
    ("--moe-pad-expert-input-to-capacity", "moe_pad_to_capacity"),
    ("--moe-expert-capacity-factor -1 --moe-pad-expert-input-to-capacity",
     "moe_pad_to_capacity"),
    # get_capacity: ceil(share x 0) = 0 tokens an expert
    ("--moe-expert-capacity-factor 0", "--moe-expert-capacity-factor"),
])
def test_capacity_megatron_refuses_is_refused(extra: str, flag: str, capsys) -> None:
    code, err = _run(extra, capsys)
    assert code == 2 and flag in err and "Traceback" not in err
