"""Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh (Llama 3 8B on 8 GPUs, tp 1
cp 1 pp 1, sequence 8,192, micro-batch 1, no recompute, the distributed optimizer,
--grad-reduce-in-bf16, --fp8-format hybrid --fp8-param-gather, the native fused cross
entropy) priced term by term, each term restated from what Megatron and Transformer
Engine allocate for that line (not from ppsim's own rules), byte for byte."""

from __future__ import annotations

import json

from ppsim.cli.main import main

# The priced part of the script's launch line (benchmarks/check_megatron_lines.py reads it).
LINE = """--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
--num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
--seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope
--rotary-base 1000000 --rotary-percent 1.0 --attention-dropout 0.0 --hidden-dropout 0.0
--swiglu --normalization RMSNorm --attention-backend fused --apply-layernorm-1p
--untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 1
--global-batch-size 128 --bf16 --grad-reduce-in-bf16 --cross-entropy-loss-fusion
--calculate-per-token-loss --use-distributed-optimizer --overlap-grad-reduce
--overlap-param-gather --fp8-format hybrid --fp8-amax-history-len 1024
--fp8-amax-compute-algo max --fp8-param-gather --tensor-model-parallel-size 1
--context-parallel-size 1 --sequence-parallel --vocab-size 128256
--gpus 8 --hardware h100-80gb""".split()

T, H, KV, FFN, V, L, DP = 8192, 4096, 1024, 14336, 128256, 32, 8
LINEAR = H * (H + 2 * KV) + H * H + 3 * H * FFN  # a layer's TE linears: QKV, proj, fc1, fc2
NORMS = 2 * H  # a layer's two RMSNorm weights (bf16)
TABLE = V * H  # 128,256 is a multiple of 128: no padding


def _priced(capsys) -> dict:
    assert main(["simulate", *LINE, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["ranks"][0]


def test_weights_gradients_and_optimizer_state_as_megatron_allocates_them(capsys) -> None:
    """Per parameter: the weight in the distributed optimizer's parameter buffer, uint8
    for TE's FP8 weights (param_and_grad_buffer.py group_params_for_buffers), bf16 for
    the rest; on Hopper the FP8 weight's transpose, made after each all-gather and kept
    (TE's post_all_gather_processing: no non-TN FP8 GEMM); the gradient buffer in bf16
    (--grad-reduce-in-bf16), whole on every rank; the fp32 master and Adam's two fp32
    moments over the 8 data-parallel ranks."""
    state = 12 / DP
    fp8_linears = L * LINEAR * (1 + 1 + 2 + state)
    bf16 = (L * NORMS + 2 * TABLE + H) * (2 + 2 + state)  # + the final norm
    assert _priced(capsys)["static_bytes"] == fp8_linears + bf16 == 44_166_436_864


def test_activations_and_the_losss_peak_as_megatron_saves_them(capsys) -> None:
    """A layer (bytes a token): RMSNorm's bf16 input and fp32 rsigma (TE's
    LayerNormLinear) and its output in FP8 for QKV's and fc1's weight gradients (TE keeps
    the quantized input's columnwise copy alone); cuDNN attention's bf16 Q, K, V, output
    and fp32 softmax statistics a head; the output projection's FP8 input; fc1's bf16
    output (bias_swiglu_impl's saved input) and fc2's FP8 input. The head: the final
    norm's input and statistics, the output layer's bf16 input (a Megatron linear), and
    the cross entropy's fp32 softmax (fused_cross_entropy.py: the logits .float()ed and
    exponentiated in place, saved); its backward casts the gradient to bf16 beside it.
    One microbatch in flight (pp 1), the peak in the loss's backward."""
    norms = 2 * (2 * H + 4 + H)
    attention = 2 * H + 2 * KV + 2 * KV + 2 * H + 4 * 32 + H
    mlp = 2 * 2 * FFN + FFN
    layer = T * (norms + attention + mlp)
    head = T * (2 * H + 4 + 2 * H + 4 * V)
    tokens = 8 * T  # the embedding's int64 token ids
    logit_grad = 2 * T * V
    rank = _priced(capsys)
    assert rank["peak_activation_bytes"] == L * layer + head + tokens + logit_grad
    assert rank["peak_memory_bytes"] == 82_315_827_200  # 78,502 MiB
