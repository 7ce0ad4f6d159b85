"""What an attention block keeps beyond its queries, keys, values and output: an unfused
core's repeated heads and probabilities, the query and key norms' inputs and statistics,
the output gate's gate and gated output (ppsim.costs.modules lists the rest)."""

from __future__ import annotations

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.kv_split import held_attention_shape, kv_copies
from ppsim.costs.layerops import scores_elements

UNFUSED_TENSORS = ("attn.k_rep", "attn.v_rep", "attn.probs", "attn.probs_mask",
                   "attn.probs_dropped")
"""What an unfused attention core keeps beyond its inputs (`unfused_tensors`)."""


GATED = "attn.gated"
"""The gated attention output, the output projection's input (attention_output_gate)."""


def qk_norm_and_gate(a: Architecture) -> dict[str, float]:
    """Bytes (all tp ranks together, the keys as the ranks hold them: ppsim.costs.
    kv_split) the query and key norms keep (their inputs and fp32 statistics, one a head
    and token), and the output gate: the gate (Megatron's compiled
    gate keeps it and attention's output, and recomputes the sigmoid) and the gated
    output, which the projection keeps in place of attention's."""
    sh, w = held_attention_shape(a), DTYPE_BYTES[a.dtype]
    tok = a.seq_length * a.micro_batch_size
    t = {}
    if a.qk_layernorm and a.attention != "mla":
        stats = 4 if a.rmsnorm else 8
        kv_heads = a.num_kv_heads * kv_copies(a)
        t.update({"qk_norm.in": tok * (sh.q + sh.k) * w,
                  "qk_norm.stats": tok * (a.num_heads + kv_heads) * stats})
    if sh.gate:
        t.update({"attn.gate": tok * sh.gate * w, GATED: tok * sh.out * w})
    return t


def unfused_tensors(a: Architecture) -> dict[str, float]:
    """Bytes (all tp ranks together) an unfused attention core keeps beyond q, k and v
    (ppsim.costs.layerops.unfused_core_ops): the repeated K and V's added heads, which
    its first batched matmul saves; the probabilities, which the softmax's backward
    reads; with dropout its mask and the dropped probabilities, the second matmul's
    input. No log-sum-exp: that is FlashAttention's."""
    sh, w = held_attention_shape(a), DTYPE_BYTES[a.dtype]
    tok = a.seq_length * a.micro_batch_size
    heads = a.num_heads
    scores = scores_elements(a) * a.tp
    t = {"attn.k_rep": tok * (heads * (sh.q // heads) - sh.k) * w,
         "attn.v_rep": tok * (heads * (sh.out // heads) - sh.v) * w,
         "attn.probs": scores * w}
    if a.dropout:
        t.update({"attn.probs_mask": scores, "attn.probs_dropped": scores * w})
    return {n: v for n, v in t.items() if v > 0}


def scores_workspace(a: Architecture, saved: dict[str, float]) -> int:
    """What an unfused attention core holds beside a layer's `saved` tensors in its
    backward: the buffer its batched matmul writes the scores into (Megatron's global
    memory buffer, one a rank, reused by every layer) and the probabilities' gradient."""
    if "attn.probs" not in saved:
        return 0
    return int(2 * scores_elements(a) * DTYPE_BYTES[a.dtype])
