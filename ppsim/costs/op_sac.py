"""torchtitan's per-op selective activation checkpointing (SelectiveAC), as a recompute
mode: what a dense decoder layer keeps and runs again under it.

torchtitan (b5bcd76, torchtitan/distributed/activation_checkpoint.py) wraps each block in
a checkpoint whose policy saves the outputs of the compute-intensive ops (matmuls,
attention) and of the reduce-scatters, recomputes every other op, and of the matmuls
recomputes every second one, counted in the block's forward order. A Llama block's
matmuls run wqkv (fused QKV, the flavours' default), wo, w1, w3, w2: wqkv, w1 and w2 are
saved, wo and w3 recomputed. So the forward keeps the block's input, the QKV projection,
attention's output and its log-sum-exp, w1's output and w2's output (at tp > 1 w2's
partial sum whole, before its reduce-scatter, and both reduce-scatters' outputs); the
backward reruns the norms, rotary, the residual adds, wo, w3 and the SiLU product, and
the sequence-parallel all-gathers (not saved) before attention and the MLP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.ops import Op
from ppsim.costs.saved import LAYER_INPUT, microbatch_tokens, saved_tensors

OP_SAC = "op-sac"
"""The recompute mode: torchtitan's SelectiveAC (`activation-checkpoint:selective`)."""
OP_SAC_MODULE = "torchtitan_op_sac"
"""Its recompute-module name: what a stage policy of this mode recomputes."""

KEPT = (LAYER_INPUT, "attn.q", "attn.k", "attn.v", "attn.out", "attn.lse")
"""Saved tensors the policy keeps as they are: the checkpoint's input, the QKV
projection's output (the query and key before rotary, the same bytes), attention's."""
REPEATED = frozenset({"norm1", "rotary", "out_proj", "residual1", "norm2", "mlp.act",
                      "residual2"})
"""Forward ops its backward runs again whole."""
HALF_REPEATED = frozenset({"mlp.fc1"})
"""Matmuls its backward runs again half of: the fused w1 and w3, of which w3 is recomputed."""


def op_sac_refusal(model: Mapping[str, Any] | Architecture) -> str:
    """Why a model (an Architecture, or its [model] fields, absent ones at their
    defaults) is not priced under op-sac, or "" where it is: the policy's saves are
    counted for a dense GQA decoder layer with FlashAttention-like attention. Float8
    linears save the same: torch's dispatch mode sees their matmul (torchao's
    Float8TrainingTensor's mm) before the subclass does, so the count is the same, the
    outputs are in the training dtype, and the amax of each cast, saved too, is a scalar."""
    fields = model if isinstance(model, Mapping) else vars(model)
    reasons = (
        (fields.get("num_experts", 0), "MoE layers (torchtitan's grouped experts and "
         "routing ops)"),
        (fields.get("attention", "gqa") == "mla", "MLA"),
        (fields.get("hybrid_layer_pattern") or fields.get("experimental_attention_variant")
         or fields.get("linear_attention_freq"), "hybrid or linear-attention layers"),
        (fields.get("fp8") == "e2m1", "NVFP4 linears (torchtitan trains in no NVFP4 "
         "recipe ppsim prices)"),
        (fields.get("unfused_attention"), "unfused attention"),
        (fields.get("dropout"), "dropout"),
        (fields.get("gated_mlp") is False, "an ungated MLP (its matmuls pair differently)"),
    )
    return next((f"its per-op saves are not priced for {what}" for hit, what in reasons
                 if hit), "")


def op_sac_kept(a: Architecture) -> dict[str, float]:
    """Name -> bytes per tensor rank a dense layer keeps from its forward to its backward."""
    saved = saved_tensors(a, "dense")
    kept = {n: saved[n] for n in KEPT if n in saved}
    w, tok, h = DTYPE_BYTES[a.dtype], microbatch_tokens(a), a.hidden_size
    kept["mlp.w1_out"] = saved["mlp.fc1_out"] / (2 if a.gated_mlp else 1)
    kept["mlp.w2_out"] = tok * h * w  # a rowwise linear's partial sum, whole on each rank
    if a.tp > 1 and a.sequence_parallel:  # the reduce-scatters after wo and w2
        kept["reduce_scatter.out"] = 2 * tok * h * w / a.token_ranks
    return kept


def half_matmul(op: Op) -> Op:
    """One of a fused matmul's two equal halves (w3 of the fused w1 and w3)."""
    m, n, k = op.shape
    return replace(op, name=op.name + ".half", flops=op.flops / 2,
                   shape=(m, max(1, n // 2), k), params=op.params // 2)


def op_sac_transient(a: Architecture) -> int:
    """Bytes its recompute brings back inside the backward: the layer's tensors that the
    policy does not keep (the recompute remakes them all before the layer's backward)."""
    saved = saved_tensors(a, "dense")
    kept = op_sac_kept(a)
    return int(max(0.0, sum(saved.values()) - sum(v for n, v in kept.items() if n in saved)))
