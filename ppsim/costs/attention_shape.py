"""The widths of the tensors an attention block makes, from the architecture's heads."""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs.arch import Architecture


@dataclass(frozen=True)
class AttentionShape:
    """Widths (summed over heads) of the tensors one attention block makes."""

    q: int
    k: int
    v: int
    out: int
    """Input width of the output projection."""
    latent: int
    """MLA's compressed query/key-value latents (0 otherwise)."""
    gate: int = 0
    """The output gate the QKV projection makes (attention_output_gate; 0 without)."""


def attention_shape(a: Architecture) -> AttentionShape:
    hd = a.head_dim or a.hidden_size // a.num_heads
    if a.attention == "mla":
        qk = a.num_heads * (hd + a.qk_rope_head_dim)
        v = a.num_heads * (a.v_head_dim or hd)
        return AttentionShape(qk, qk, v, v, a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim)
    kv, q = a.num_kv_heads * hd, a.num_heads * hd
    return AttentionShape(q, kv, kv, q, 0, q if a.attention_output_gate else 0)
