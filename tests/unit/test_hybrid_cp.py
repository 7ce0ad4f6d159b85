"""Context parallelism on a hybrid stack, as Megatron-LM runs it: an attention layer
splits its attention by sequence chunks (its K/V traffic); a Mamba or GatedDeltaNet
mixer exchanges its in_proj output for 1 / cp of the heads over the whole sequence and
its gated output back (megatron/core/ssm/mamba_context_parallel.py, gated_delta_net's
a2a_cp_to_hp), each way; an MLP or MoE block alone has no context-parallel traffic.
Closed forms from the h100-80gb preset: NVLink 450 GB/s each way, 1 us a step."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.pipeline.problem import model_costs

NV, NV_STEP = 450e6, 1e-3  # bytes per ms, ms


def _costs(cp: int, recompute: str = "none", **model):
    c = config_from_dict({"model": {"preset": "nemotron-h-8b", "cp": cp,
                                    "recompute": recompute, **model},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    a = c.model.arch
    alone = transformer_costs(replace(a, seq_length=a.seq_length // cp),
                              accelerator(c.hardware))
    return model_costs(c), alone


def _a2a(nbytes: float, n: int) -> float:
    """An all-to-all over n GPUs of one node, each sending nbytes (its own share stays)."""
    return (n - 1) * NV_STEP + nbytes * (n - 1) / n / NV


def test_an_mlp_block_has_no_context_parallel_traffic() -> None:
    """It was priced an attention layer's other chunks and K/V ring: a whole attention
    it does not have."""
    got, alone = _costs(2)
    at = got.kinds.index("mlp")
    assert got.layers[at].forward_ms == pytest.approx(alone.layers[at].forward_ms, rel=1e-12)
    assert got.layers[at].backward_ms == pytest.approx(alone.layers[at].backward_ms,
                                                       rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_a_mamba_mixer_exchanges_heads_for_the_sequence_each_way(recompute: str) -> None:
    """Nemotron-H 8B at cp 2: 4,096 tokens a rank; in_proj out 2 x 8,192 + 2 x 8 x 128 +
    128 = 18,560 wide before the scan, 8,192 after, bf16; the backward mirrors both, and
    a full recompute runs the forward's again."""
    got, alone = _costs(2, recompute)
    at = got.kinds.index("mamba")
    tokens = 8192 // 2
    pair = _a2a(tokens * 18560 * 2, 2) + _a2a(tokens * 8192 * 2, 2)
    assert got.layers[at].forward_ms - alone.layers[at].forward_ms == pytest.approx(pair)
    again = 2 if recompute == "full" else 1
    assert got.layers[at].backward_ms - alone.layers[at].backward_ms \
        == pytest.approx(again * pair)


def test_a_rank_with_fewer_groups_than_cp_repeats_b_and_c() -> None:
    """4 groups at cp 8 (tp 1): each rank's B and C go out 8 / 4 = 2 times, so the
    exchange before the scan carries 2 x 4 x 128 more a token (in_proj 2 x 8,192 +
    2 x 4 x 128 + 128 = 17,536 wide)."""
    got, alone = _costs(8, mamba_num_groups=4)
    at = got.kinds.index("mamba")
    tokens = 8192 // 8
    pair = _a2a(tokens * (17536 + 2 * 4 * 128) * 2, 8) + _a2a(tokens * 8192 * 2, 8)
    assert got.layers[at].forward_ms - alone.layers[at].forward_ms == pytest.approx(pair)


def test_an_attention_layer_still_pays_its_other_chunks() -> None:
    got, alone = _costs(2)
    at = got.kinds.index("attention")
    assert got.layers[at].forward_ms > alone.layers[at].forward_ms


@pytest.mark.parametrize("flags, message", [
    ("--preset tiny-hybrid --tp 4", "model.tp: ngroups must be evenly divisible by tp_size"),
    ("--preset nemotron-h-8b --pp 1 --mamba-num-heads 120 --tp 8 --cp 2 --gpus 16 "
     "--global-batch-size 16", "model.cp: nheads must be evenly divisible by tp_size * "
     "cp_size"),
    ("--preset nemotron-h-8b --pp 1 --mamba-num-heads 120 --mamba-num-groups 6 --cp 4 "
     "--gpus 16 --global-batch-size 16", "model.cp: ngroups must be evenly divisible by "
     "tp_size * cp_size"),
    ("--preset nemotron-h-8b --pp 1 --mamba-num-heads 120 --mamba-num-groups 6 --cp 4 "
     "--tp 2 --gpus 16 --global-batch-size 16", "model.cp: cp_size must be evenly "
     "divisible by ngroups/tp_size"),
    ("--preset qwen3-next-80b-a3b --cp 32 --gpus 64 --global-batch-size 64",
     "model.cp: self.linear_num_key_heads=16 must be a multiple of "
     "(self.tensor_model_parallel_size=1 * self.context_parallel_size=32)."),
    ("--preset qwen3-next-80b-a3b --linear-num-value-heads 6 --linear-num-key-heads 3 "
     "--tp 2 --gpus 64 --global-batch-size 64", "model.tp: self.linear_num_key_heads=3 "
     "must be a multiple of (self.tensor_model_parallel_size=2 * "
     "self.context_parallel_size=1)."),
])
def test_a_split_megatron_asserts_against_is_refused_in_its_words(capsys, flags: str,
                                                                  message: str) -> None:
    assert main(["simulate", "--hardware", "h100-80gb", *shlex.split(flags)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def _plan_cps(capsys, *extra: str) -> set[int]:
    assert main(["plan", "--preset", "nemotron-h-8b", "--hybrid-layer-pattern", "M-M*-M-",
                 "--hardware", "h100-80gb", *extra,
                 "--gpus", "32", "--global-batch-size", "32", "--tp", "8",
                 "--time-budget", "4", "--top", "40", "--json"]) == 0
    return {c["cp"] for c in json.loads(capsys.readouterr().out)["candidates"]}


def test_the_job_search_tries_no_cp_the_mixers_refuse(capsys) -> None:
    """120 Mamba heads at tp 8 are 15 a rank: no cp > 1 splits them; 128 are 16."""
    assert _plan_cps(capsys, "--mamba-num-heads", "120") == {1}
    assert len(_plan_cps(capsys)) > 1
