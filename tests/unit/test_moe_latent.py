"""Megatron's MoE latent projections (--moe-latent-size, Nemotron 3): the routed experts
work on tokens projected down to the latent width and back, the dispatcher moves latent
tokens, and the projections are whole on every tensor-parallel rank."""

from __future__ import annotations

import io
import shlex
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace

import pytest

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser, main
from ppsim.config.presets import MODEL_PRESETS
from ppsim.costs.arch import Architecture
from ppsim.costs.kinds import model_params
from ppsim.costs.layerops import mlp_ops
from ppsim.costs.params import kind_params
from ppsim.costs.transformer import held_params

MIXTRAL = Architecture(**MODEL_PRESETS["mixtral-8x7b"])

# Megatron-LM's examples/post_training/modelopt/conf/nvidia/
# NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh, MODEL_ARGS as written but for ModelOpt's
# --export-model-type; the vocabulary is its tokenizer's (131,072).
PATTERN = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
SUPER = f"""--trust-remote-code --save-interval 100000 --micro-batch-size 1
--enable-experimental --use-fused-weighted-squared-relu --cross-entropy-loss-fusion
--cross-entropy-fusion-impl native --num-experts 512 --moe-router-score-function sigmoid
--moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-topk 22 --moe-permute-fusion
--moe-router-topk-scaling-factor 5.0 --moe-router-enable-expert-bias --moe-router-dtype fp32
--moe-router-load-balancing-type seq_aux_loss --moe-shared-expert-intermediate-size 5376
--moe-token-dispatcher-type alltoall --moe-latent-size 1024 --attention-backend flash
--disable-gloo-process-groups --is-hybrid-model --mamba-num-heads 128 --mamba-head-dim 64
--hybrid-layer-pattern {PATTERN}
--use-mcore-models --untie-embeddings-and-output-weights --disable-bias-linear
--init-method-std 0.014 --position-embedding-type none --squared-relu --hidden-size 4096
--num-attention-heads 32 --group-query-attention --num-query-groups 2 --ffn-hidden-size 2688
--kv-channels 128 --normalization RMSNorm --attention-dropout 0.0 --hidden-dropout 0.0
--tokenizer-type HuggingFaceTokenizer --bf16 --seq-length 8192 --max-position-embeddings 8192
--vocab-size 131072"""


def test_nemotron_3_super_has_the_parameters_its_name_says() -> None:
    """120B total, 12B active (the name; the active count without the embedding)."""
    args = build_parser().parse_args(["simulate", *shlex.split(SUPER)])
    a = config_from_args(args).model.arch
    assert a.moe_latent_size == 1024
    counts = model_params(a)
    total, active = counts.total, counts.active
    assert total == pytest.approx(120e9, rel=0.02)
    assert active - a.vocab_size * a.hidden_size == pytest.approx(12e9, rel=0.03)


def test_the_experts_and_the_dispatch_work_at_the_latent_width() -> None:
    latent = replace(MIXTRAL, moe_latent_size=1024)

    def flops(a: Architecture, prefix: str) -> float:
        return sum(op.flops for op in mlp_ops(a, "moe") if op.name.startswith(prefix))

    assert flops(latent, "experts.") == pytest.approx(flops(MIXTRAL, "experts.") / 4)
    tok, h = MIXTRAL.seq_length * MIXTRAL.micro_batch_size, MIXTRAL.hidden_size
    # Down to 1024 and back up: two matmuls of tokens x h x 1024, 2 FLOPs a multiply-add.
    assert flops(latent, "latent.") == pytest.approx(2 * 2 * tok * h * 1024)
    dispatch = {op.name: op.nbytes for op in mlp_ops(latent, "moe")}["dispatch"]
    plain = {op.name: op.nbytes for op in mlp_ops(MIXTRAL, "moe")}["dispatch"]
    assert dispatch == pytest.approx(plain / 4)


def test_the_projections_are_whole_on_every_tp_rank() -> None:
    a = replace(MIXTRAL, moe_latent_size=1024, tp=2)
    router = 4096 * 8  # Megatron's TopKRouter weight, whole too
    assert kind_params(a, "moe").duplicated == 2 * 4096 * 1024 + router
    # Beside the same layer without them, a tp rank holds both projections whole (not
    # half of them, as it does the attention's and the shared experts' matrices).
    without = replace(MIXTRAL, tp=2)
    assert held_params(a, "moe").dense - held_params(without, "moe").dense == \
        pytest.approx(2 * 4096 * 1024)


def test_shared_expert_overlap_with_latents_is_refused() -> None:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(["simulate", *shlex.split(SUPER), "--moe-shared-expert-overlap"])
    assert code == 2
    assert "Shared expert overlap with MoE latent projections is not supported during " \
        "training" in err.getvalue()
