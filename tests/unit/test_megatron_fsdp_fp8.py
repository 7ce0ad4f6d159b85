"""FP8 under Megatron-FSDP (Transformer Engine's, Hopper's recipes) against closed forms
restated from Megatron-LM's code: megatron/core/distributed/fsdp/src/megatron_fsdp/
megatron_fsdp.py (with --fp8-param-gather the weights are FP8 Float8Tensors in their
shards and gathered as such; after the backward's gather fp8_create_transpose_cache makes
each weight's transpose, dropped after use unless keep_fp8_transpose_cache),
megatron/core/transformer/module.py (set_is_first_microbatch: with bf16 weights TE
quantizes each weight on the first microbatch and keeps the FP8 copy and its transpose)
and the h100-80gb preset (HBM 3,000 GB/s; links as tests/fsdp_forms.py gives them). It
was refused by name; Megatron's own examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh
runs it."""

from __future__ import annotations

import json

import pytest
from fsdp_forms import LAYER, NV, NV_STEP, cfg, ring
from helpers import run_main

from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job import fsdp
from ppsim.job.model import build_job
from ppsim.pipeline.problem import model_costs

MFSDP = {"fsdp": True, "fsdp_framework": "megatron-fsdp", "dp": 8}
FP8 = {"fp8": "hybrid", "fp8_recipe": "tensorwise"}
MATRICES = LAYER - 2 * 4096
"""A Llama-3-8B layer's FP8 weights: every matrix (its two norms stay bf16)."""
HBM = 3000e6  # bytes per ms


def layer0(model: dict) -> object:
    c = cfg({**MFSDP, **model})
    return transformer_costs(c.model.arch, accelerator(c.hardware)).layers[0]


def test_fp8_weights_shard_in_one_byte() -> None:
    """The shard keeps the FP8 weight (1 byte), the bf16 gradient (2), the fp32 master (4)
    and the moments (8): 15 bytes a matrix weight over the 8 ranks, not bf16 weights' 16
    (the norms' stay bf16)."""
    bf16 = layer0({})
    fp8 = layer0({**FP8, "fp8_param_gather": True})
    assert bf16.static_bytes == pytest.approx(LAYER * 16 / 8, abs=2)
    assert fp8.static_bytes == pytest.approx((MATRICES * 15 + (LAYER - MATRICES) * 16) / 8,
                                             abs=2)


def test_bf16_weights_keep_te_s_fp8_copies_all_step() -> None:
    """Without --fp8-param-gather TE caches each whole weight in FP8 and its transpose
    from the first microbatch: 2 bytes a matrix weight beside the shard."""
    assert layer0(FP8).static_bytes == pytest.approx(LAYER * 16 / 8 + 2 * MATRICES, abs=2)


def test_each_backward_makes_the_transposes_again() -> None:
    """With FP8 weights the backward reads each gathered weight and writes its transpose
    (a byte each) before its GEMMs; the forward is the same."""
    cached = layer0(FP8)
    remade = layer0({**FP8, "fp8_param_gather": True})
    assert remade.forward_ms == cached.forward_ms
    assert remade.backward_ms == pytest.approx(cached.backward_ms + 2 * MATRICES / HBM)


def test_the_layers_gather_in_fp8_and_the_buffers_hold_a_transpose() -> None:
    """A unit's gather moves 1 byte a parameter over the node's 8 ranks; the buffers are
    two units' FP8 weights, one unit's transpose and one unit's bf16 gradient."""
    job = build_job(cfg({**MFSDP, **FP8, "fp8_param_gather": True}))
    bf16 = build_job(cfg(MFSDP))
    assert job is not None and bf16 is not None
    assert fsdp.gather_ms(job, LAYER) == pytest.approx(ring(8, LAYER * 1, NV, NV_STEP))
    assert fsdp.gather_ms(bf16, LAYER) == pytest.approx(ring(8, LAYER * 2, NV, NV_STEP))
    assert job.fsdp_buffer_bytes == LAYER * (2 * 1 + 1 + 2)
    assert bf16.fsdp_buffer_bytes == LAYER * (2 * 2 + 2)


# Megatron-LM's examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh, its model,
# training, FSDP, FP8 and parallel arguments as written (one 8-GPU node).
EXAMPLE = """--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
--num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
--seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope
--rotary-base 1000000 --rotary-percent 1.0 --attention-dropout 0.0 --hidden-dropout 0.0
--swiglu --normalization RMSNorm --init-method-std 0.0134 --attention-backend fused
--apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear
--micro-batch-size 1 --global-batch-size 128 --train-samples 1953125000
--lr-decay-samples 1949218748 --lr-warmup-samples 3906252 --lr 0.00015 --min-lr 0.00001
--decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5 --lr-decay-style cosine --clip-grad 1.0
--weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16 --cross-entropy-loss-fusion
--no-check-for-nan-in-loss-and-grad --manual-gc --empty-unused-memory-level 1
--exit-duration-in-mins 235 --use-megatron-fsdp --data-parallel-sharding-strategy
optim_grads_params --no-gradient-accumulation-fusion --calculate-per-token-loss
--init-model-with-meta-device --ckpt-format fsdp_dtensor --use-nccl-ub
--fsdp-double-buffer --fsdp-manual-registration --fp8-format hybrid
--fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather
--tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel
--use-distributed-optimizer --vocab-size 128256""".split()


def test_megatrons_fp8_fsdp_example_is_priced() -> None:
    """Its line as written (the tokenizer's vocabulary given): FP8 under Megatron-FSDP,
    faster than the same line in bf16 and lighter. It was refused ("under Megatron's
    --use-megatron-fsdp FP8 is Transformer Engine's ...")."""
    def simulate(argv: list[str]) -> dict:
        code, out, err = run_main(["simulate", "--hardware", "h100-80gb", "--gpus", "8",
                                   *argv, "--json"])
        assert code == 0, err
        return json.loads(out)

    fp8 = simulate(EXAMPLE)
    bf16 = simulate([a for a in EXAMPLE if a not in (
        "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
        "--fp8-amax-compute-algo", "max", "--fp8-param-gather")])
    assert fp8["iteration_time_ms"] < bf16["iteration_time_ms"]
    peak = [max(r["peak_memory_bytes"] for r in x["ranks"]) for x in (fp8, bf16)]
    assert peak[0] < peak[1]


@pytest.mark.parametrize(("extra", "field", "words"), [
    (["--use-megatron-fsdp", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"],
     "model.fp8_recipe", "Hopper's FP8 recipes"),
    (["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--fp8-format", "hybrid"],
     "model.fp8", "--use-torch-fsdp2 FP8"),
])
def test_what_it_does_not_price_is_refused(extra: list[str], field: str, words: str) -> None:
    code, out, err = run_main(["simulate", "--preset", "llama3-8b", "--hardware",
                               "b200-180gb", "--gpus", "8", "--pp", "1", *extra])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{field}: " in err and words in err


def test_the_model_costs_carry_the_fp8_shard() -> None:
    """Through the job as simulated: the layers' static bytes are the 15-byte shard."""
    got = model_costs(cfg({**MFSDP, **FP8, "fp8_param_gather": True}))
    assert got.layers[0].static_bytes == pytest.approx(
        (MATRICES * 15 + (LAYER - MATRICES) * 16) / 8, abs=2)
