"""The dispatcher's permutation fused or not (Megatron --moe-permute-fusion, off by default).

Megatron-LM's own Mixtral example passes no --moe-permute-fusion, so it runs the torch
unpermute (a zeroed output, scatter_add); ppsim took
the flag silently and priced every MoE line with Transformer Engine's fused kernels."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from helpers import run_main as _run
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import mlp_ops
from ppsim.costs.modules import kept_tensors, module_effect

# Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh, its model arguments
MIXTRAL = """--use-mcore-models --disable-bias-linear --seq-length 4096
--max-position-embeddings 32768 --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
--num-attention-heads 32 --init-method-std 0.01 --attention-dropout 0.0
--hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
--untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8
--no-masked-softmax-fusion --no-position-embedding --rotary-base 1000000 --num-experts 8
--moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
--moe-grouped-gemm --moe-token-dispatcher-type alltoall --micro-batch-size 1 --bf16
--vocab-size 32000"""
JOB = ["--hardware", "h100-80gb", "--gpus", "64", "--global-batch-size", "256", "--pp", "4",
       "--ep", "8", "--json"]


def _simulate(line: str) -> dict:
    code, out, err = _run(["simulate", *shlex.split(line), *JOB])
    assert code == 0, err
    return json.loads(out)


def test_megatrons_mixtral_example_runs_the_torch_permutation() -> None:
    """As written it is slower than with --moe-permute-fusion; over the Mixtral preset
    (priced as Megatron-Bridge's recipes run it, fused) the flag changes nothing."""
    unfused, fused = _simulate(MIXTRAL), _simulate(MIXTRAL + " --moe-permute-fusion")
    assert unfused["iteration_time_ms"] > fused["iteration_time_ms"]
    assert [r["peak_memory_bytes"] for r in unfused["ranks"]] == \
        [r["peak_memory_bytes"] for r in fused["ranks"]]
    preset = "--preset mixtral-8x7b"
    assert _simulate(preset)["iteration_time_ms"] == \
        _simulate(preset + " --moe-permute-fusion")["iteration_time_ms"]


@settings(max_examples=40, deadline=None)
@given(h=st.sampled_from([64, 256]), s=st.sampled_from([32, 128]), b=st.integers(1, 3),
       tp=st.sampled_from([1, 2]), experts=st.sampled_from([4, 8]), top_k=st.integers(1, 4),
       latent=st.sampled_from([0, 32]))
def test_the_torch_unpermute_is_its_closed_form_and_keeps_nothing_more(h, s, b, tp, experts,
                                                                       top_k, latent) -> None:
    """Per tp rank: the zeroed output's tokens of the experts' width written forward
    (Megatron's combine_postprocess unpermutes with no probabilities: they weighed the
    experts' activation), nothing more backward (scatter_add's is the fused gather), the
    same tensors kept; `moe` recompute runs it again."""
    a = Architecture(num_layers=2, hidden_size=h, num_heads=4, num_kv_heads=4,
                     ffn_hidden_size=2 * h, vocab_size=512, seq_length=s, micro_batch_size=b,
                     tp=tp, num_experts=experts, top_k=min(top_k, experts),
                     moe_ffn_hidden_size=64, moe_latent_size=latent, moe_permute_fusion=False)
    ops = {op.name: op for op in mlp_ops(a, "moe")}
    width = latent or h
    assert ops["combine.unfused"].nbytes == pytest.approx(s * b * width * 2 / tp)
    assert not ops["combine.unfused"].backward_bytes
    fused = replace(a, moe_permute_fusion=True)
    assert "combine.unfused" not in {op.name for op in mlp_ops(fused, "moe")}
    assert kept_tensors(a, "moe") == kept_tensors(fused, "moe")
    assert "combine.unfused" in module_effect(a, "moe", ("moe",)).repeated_ops


def test_presets_print_it_and_a_line_over_nothing_takes_megatrons_default() -> None:
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.cli.megatron_args import megatron_model_args
    from ppsim.config.model import parse_model

    def arch(line: str) -> Architecture:
        return config_from_args(build_parser().parse_args(["simulate", *shlex.split(line)])
                                ).model.arch

    assert not arch(MIXTRAL).moe_permute_fusion
    assert arch(MIXTRAL + " --moe-permute-fusion").moe_permute_fusion
    preset = parse_model({"preset": "mixtral-8x7b"}).arch
    assert preset.moe_permute_fusion and "--moe-permute-fusion" in megatron_model_args(preset)
