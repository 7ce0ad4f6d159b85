"""Megatron's FLOP count of one iteration, the figure its log's TFLOP/s/GPU divides.

Restated from `num_floating_point_operations` (megatron/training/training.py, the BSHD
path: every sequence seq_length tokens, causal). A transformer (transformer_flops): per
token, every GEMM three times (forward, weight gradient, input gradient) at two FLOPs per
multiply-add; attention projections (the output gate's too, --attention-output-gate),
the core attention's causal half of QK^T and AV, dense MLPs, the routed experts a token
visits (top_k, through the latent where --moe-latent-size sets one) and the shared
experts, MTP modules (counted as layers of
the last layer's kind plus their norms and projection), GatedDeltaNet in place of
attention where --linear-attention-freq puts it (its MTP layers' too), and the logits of
the padded vocabulary once per head (main and MTP). A gated MLP counts its third matrix only under
--swiglu (`ffn_expansion_factor = 3 if args.swiglu else 2`): --quick-geglu (gpt-oss)
counts two. A hybrid stack (--hybrid-layer-pattern, hybrid_flops) counts each symbol of
the main pattern and of every MTP depth: Mamba-2, GatedDeltaNet, attention, MLP and MoE
layers by their own formulas ('D' and '+' layers, and an attention layer's output gate,
are not counted, as in Megatron), and the logits once per head. Routers, norms and the
optimizer are not counted, as in Megatron.
"""

from __future__ import annotations

from ppsim.costs.arch import Architecture
from ppsim.costs.choices import LINEAR_VARIANTS
from ppsim.costs.hybrid import parse_pattern
from ppsim.costs.kinds import any_kind_params
from ppsim.costs.layerops import padded_vocab
from ppsim.costs.mixers import ATTENTION_KINDS
from ppsim.costs.patterns import linear_attention_layers
from ppsim.costs.stack import layer_kinds, mlp_kind

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
    gate = q if a.attention_output_gate else 0
    return GEMM * (h * (q + 2 * kv + gate) + q * h), GEMM * q / 2 * 2


def _ffn_factor(a: Architecture) -> int:
    """Matrices of an MLP as Megatron counts them: three only under --swiglu."""
    return 3 if a.gated_mlp and a.gated_activation == "swiglu" else 2


def _routed_per_token(a: Architecture) -> float:
    """One MoE layer's routed experts' multiply-adds per token, over h: through the
    latent when there is one (its down and up projections too)."""
    routed = a.moe_ffn_hidden_size * a.top_k * _ffn_factor(a)
    if not a.moe_latent_size:
        return routed
    return routed * a.moe_latent_size / a.hidden_size + 2 * a.moe_latent_size


def iteration_flops(a: Architecture, global_batch_size: int, causal: bool = True) -> float:
    """FLOPs of one iteration of `global_batch_size` sequences of a.seq_length tokens.
    causal=False counts the whole s x s attention, as Megatron did before March 2025
    (commit 8873b55d6a): the formula behind figures published until then."""
    if a.hybrid_layer_pattern:
        return _hybrid_flops(a, global_batch_size, causal)
    kinds = [mlp_kind(k) for k in layer_kinds(a)]
    moe, dense = kinds.count("moe"), kinds.count("dense")
    if a.mtp_layers:
        last_moe = bool(kinds) and kinds[-1] == "moe"
        moe += a.mtp_layers if last_moe else 0
        dense += 0 if last_moe else a.mtp_layers
    layers = a.num_layers + a.mtp_layers
    gdn = _linear_attention_layers(a, layers)
    h, ffn_x = a.hidden_size, _ffn_factor(a)
    shared = a.shared_width
    linear, core = _attention_terms(a)
    per_token = (GEMM * h * (a.ffn_hidden_size * ffn_x * dense
                             + _routed_per_token(a) * moe
                             + shared * ffn_x * moe)
                 + linear * (layers - gdn) + 3 * _mixer_per_token(a, "gdn") * gdn
                 + GEMM * a.mtp_layers * (3 * h + 2 * h * h)
                 + GEMM * h * padded_vocab(a) * (a.mtp_layers + 1))
    tokens = global_batch_size * a.seq_length
    full = 1 if causal else 2
    return tokens * per_token \
        + global_batch_size * a.seq_length ** 2 * core * (layers - gdn) * full


def _linear_attention_layers(a: Architecture, layers: int) -> int:
    """GatedDeltaNet layers among the decoder's and MTP's `layers`, as transformer_flops
    counts them: --linear-attention-freq N over every one of them (MTP's too); a list
    over the decoder's."""
    freq = a.linear_attention_freq.strip()
    if a.experimental_attention_variant not in LINEAR_VARIANTS:
        return 0  # DSA is counted as the MLA it attends by
    if freq.isdigit():
        return sum(linear_attention_layers(freq, layers))
    return sum(k.startswith("gdn-") for k in layer_kinds(a))


def _mixer_per_token(a: Architecture, kind: str) -> float:
    """Forward FLOPs per token of one hybrid layer's token-linear work (hybrid_flops)."""
    h = a.hidden_size
    if kind == "mamba":
        d_in = 2 * h
        heads = a.mamba_num_heads or d_in // a.mamba_head_dim
        return (2 * h * (2 * d_in + 2 * a.mamba_num_groups * a.mamba_state_dim + heads)
                + 7 * d_in * a.mamba_state_dim + 2 * d_in * h)
    if kind == "gdn":
        qk = a.linear_key_head_dim * a.linear_num_key_heads
        v = a.linear_value_head_dim * a.linear_num_value_heads
        in_proj = 2 * qk + 2 * v + 2 * a.linear_num_value_heads
        return 2 * (h * in_proj + a.linear_conv_kernel_dim * (2 * qk + v)
                    + a.linear_num_value_heads * a.linear_value_head_dim ** 2 * 4 + h * v)
    if kind == "attention":
        q = (a.head_dim or h // a.num_heads) * a.num_heads
        return 4 * q * (h + h * a.num_kv_heads / a.num_heads)
    if kind == "mlp":
        return 4 * a.ffn_hidden_size * h * _ffn_factor(a) / 2
    if kind == "moe-mlp":
        shared = a.shared_width * _ffn_factor(a)
        return 2 * h * (_routed_per_token(a) + shared)
    return 0.0  # 'D' and '+': not in Megatron's count


def _hybrid_flops(a: Architecture, global_batch_size: int, causal: bool) -> float:
    p = parse_pattern(a.hybrid_layer_pattern)
    kinds = [*p.kinds, *(p.mtp_kinds * p.mtp_depths)]
    h, s = a.hidden_size, a.seq_length
    q = (a.head_dim or h // a.num_heads) * a.num_heads
    per_token = (sum(_mixer_per_token(a, k) for k in kinds)
                 + 2 * h * padded_vocab(a) * (1 + p.mtp_depths))
    core = 2 * s * q * kinds.count("attention") * (1 if causal else 2)
    return 3 * global_batch_size * s * (per_token + core)




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
