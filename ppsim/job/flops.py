"""Megatron's FLOP count of one iteration, the figure its log's TFLOP/s/GPU divides.

Restated from `num_floating_point_operations` (megatron/training/training.py,
transformer_flops, the BSHD path: every sequence seq_length tokens, causal): per token,
every GEMM three times (forward, weight gradient, input gradient) at two FLOPs per
multiply-add; attention projections, the core attention's causal half of QK^T and AV,
dense MLPs, the routed experts a token visits (top_k) and the shared experts, MTP
modules (counted as layers of the last layer's kind plus their norms and projection),
and the logits of the padded vocabulary once per head (main and MTP). Routers, norms
and the optimizer are not counted, as in Megatron.
"""

from __future__ import annotations

from ppsim.costs.arch import Architecture, layer_kinds
from ppsim.costs.layerops import padded_vocab
from ppsim.costs.mixers import any_kind_params

GEMM = 3 * 2
"""Forward + weight gradient + input gradient, 2 FLOPs per multiply-add."""


def _attention_terms(a: Architecture) -> tuple[float, float]:
    """(token-linear FLOPs per token, core FLOPs per token per token of context) of one
    attention layer."""
    h, n = a.hidden_size, a.num_heads
    hd = a.head_dim or h // n
    if a.attention == "mla":
        rope, v = a.qk_rope_head_dim, a.v_head_dim or hd
        q = (a.q_lora_rank * (h + n * (hd + rope) + 1) if a.q_lora_rank
             else h * n * (hd + rope))
        kv = a.kv_lora_rank * (h + n * (hd + v) + 1) + h * rope
        linear = GEMM * (q + kv + n * v * h)
        core = GEMM * (n * (hd + rope) / 2 + n * v / 2)
        return linear, core
    q, kv = hd * n, hd * a.num_kv_heads
    return GEMM * (h * (q + 2 * kv) + q * h), GEMM * q / 2 * 2


def iteration_flops(a: Architecture, global_batch_size: int, causal: bool = True) -> float:
    """FLOPs of one iteration of `global_batch_size` sequences of a.seq_length tokens.
    causal=False counts the whole s x s attention, as Megatron did before March 2025
    (commit 8873b55d6a): the formula behind figures published until then."""
    kinds = layer_kinds(a)
    moe, dense = kinds.count("moe"), kinds.count("dense")
    if a.mtp_layers:
        last_moe = bool(kinds) and kinds[-1] == "moe"
        moe += a.mtp_layers if last_moe else 0
        dense += 0 if last_moe else a.mtp_layers
    layers = a.num_layers + a.mtp_layers
    h, ffn_x = a.hidden_size, (3 if a.gated_mlp else 2)
    shared = a.shared_experts * a.moe_ffn_hidden_size
    linear, core = _attention_terms(a)
    per_token = (GEMM * h * (a.ffn_hidden_size * ffn_x * dense
                             + a.moe_ffn_hidden_size * a.top_k * ffn_x * moe
                             + shared * ffn_x * moe)
                 + linear * layers
                 + GEMM * a.mtp_layers * (3 * h + 2 * h * h)
                 + GEMM * h * padded_vocab(a) * (a.mtp_layers + 1))
    tokens = global_batch_size * a.seq_length
    full = 1 if causal else 2
    return tokens * per_token + global_batch_size * a.seq_length ** 2 * core * layers * full


ATTENTION_KINDS = frozenset({"dense", "moe", "attention", "dsa", "mla"})
"""Layer kinds with a full attention (the rest are Mamba, GatedDeltaNet, MLP or MoE
mixers, whose cost is linear in the sequence)."""


def torchtitan_flops_per_token(a: Architecture) -> float:
    """torchtitan's `num_flops_per_token` (torchtitan/models/utils.py,
    get_dense_model_nparams_and_flops and get_moe_model_nparams_and_flops), the figure
    its logged MFU multiplies by tokens/s per GPU: 6 x the parameters a token's matmuls
    use (every parameter, norms included, but the embedding table unless it is tied to
    the head; routed experts top_k / num_experts of theirs) + 6 x full-attention layers x
    heads x (q/k + v head dims) x seq_length, the whole s x s (no causal halving, no
    recomputation). MTP modules are left out."""
    kinds = layer_kinds(a)
    h, embed = a.hidden_size, a.vocab_size * a.hidden_size
    used = h + embed  # the final norm and the head (the tied table, counted once)
    for k in kinds:
        p = any_kind_params(a, k)
        used += p.active + p.norms
    hd = a.head_dim or h // a.num_heads
    head_dims = (hd + a.qk_rope_head_dim + (a.v_head_dim or hd) if a.attention == "mla"
                 else 2 * hd)
    full_attention = sum(k in ATTENTION_KINDS for k in kinds)
    return 6 * used + 6 * full_attention * a.num_heads * head_dims * a.seq_length
