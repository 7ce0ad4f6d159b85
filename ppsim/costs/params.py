"""A decoder layer's parameter counts, by kind: its attention block, its MLP or MoE
block (routed experts apart), its norms, an MTP module's own weights (the models'
published configs; checked against their model cards)."""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs.arch import Architecture
from ppsim.costs.attention_shape import attention_shape


@dataclass(frozen=True)
class AttentionParams:
    """One attention block's weights."""

    matmuls: int
    """Its projections' weights."""
    norms: int
    """Its norms' weights (one value each), the input norm included."""
    duplicated: int = 0
    """Part of `matmuls` held whole on every tensor-parallel rank: MLA's down projections,
    which Megatron's Transformer Engine spec builds as TELinear(parallel_mode="duplicated")
    (multi_latent_attention.py), on the sequence-parallel tokens."""


def attention_params(a: Architecture) -> AttentionParams:
    """The weights of one attention block, its input norm included."""
    h, sh = a.hidden_size, attention_shape(a)
    if a.attention == "mla":
        hd = a.head_dim or h // a.num_heads
        q = h * a.q_lora_rank + a.q_lora_rank * sh.q if a.q_lora_rank else h * sh.q
        down = h * (a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim)
        kv = (h * (a.kv_lora_rank + a.qk_rope_head_dim)
              + a.kv_lora_rank * a.num_heads * (hd + (a.v_head_dim or hd)))
        return AttentionParams(q + kv + sh.out * h,
                               h + (a.q_lora_rank + a.kv_lora_rank) * a.qk_layernorm, down)
    hd = a.head_dim or h // a.num_heads
    return AttentionParams(h * (sh.q + sh.k + sh.v + sh.gate) + sh.out * h,
                           h + 2 * hd * a.qk_layernorm)


def _mlp_params(a: Architecture, ffn: int, width: int = 0) -> int:
    """An MLP of `ffn` from and to `width` (default: the hidden size)."""
    return (width or a.hidden_size) * ffn * (3 if a.gated_mlp else 2)


@dataclass(frozen=True)
class KindParams:
    """Parameter counts of one decoder layer of a kind."""

    dense: int
    """Weights every rank of a tp group holds (matmuls a 1/tp share, norms whole)."""
    experts: int
    """Routed expert weights, divided over ep x etp."""
    active: int
    """Weights one token's matmuls touch (FLOPs = 2 x tokens x active)."""
    norms: int = 0
    """Part of `dense` in norms (LayerNorm: weight and bias), not split by tp."""
    duplicated: int = 0
    """Part of `dense` in matmuls held whole on every tp rank: MLA's down projections, the
    router (Megatron's TopKRouter weight is one unsplit parameter), MoE latent
    projections."""


def kind_params(a: Architecture, kind: str) -> KindParams:
    block = attention_params(a)
    attn = block.matmuls
    norm = (block.norms + a.hidden_size) * (1 if a.rmsnorm else 2)  # and the MLP's input norm
    if kind == "dense":
        mlp = _mlp_params(a, a.ffn_hidden_size)
        return KindParams(attn + mlp + norm, 0, attn + mlp, norm, block.duplicated)
    expert = _mlp_params(a, a.moe_ffn_hidden_size, a.moe_latent_size)
    router = a.hidden_size * a.num_experts
    shared = _mlp_params(a, a.shared_width)  # on the whole width
    latent = 2 * a.hidden_size * a.moe_latent_size  # down to the latent width and back up
    whole = latent + a.hidden_size * (a.shared_expert_gate and a.shared_width > 0)
    return KindParams(attn + shared + router + whole + norm, a.num_experts * expert,
                      attn + shared + router + whole + a.top_k * expert, norm,
                      whole + router + block.duplicated)


def mtp_extra_params(a: Architecture) -> int:
    """An MTP module beyond its decoder layer: two norms, the 2h -> h projection, a
    final norm (the embedding and the head are shared with the main model)."""
    h = a.hidden_size
    return 2 * h * h + 3 * h
