"""torchtitan's per-op selective activation checkpointing (SelectiveAC), as a recompute
mode: what a decoder layer keeps and runs again under it.

torchtitan (b5bcd76, torchtitan/distributed/activation_checkpoint.py) wraps each block in
a checkpoint whose policy saves the outputs of the compute-intensive ops (matmuls,
attention), of top-k and of the reduce-scatters and all-to-alls, recomputes every other
op, and of the matmuls recomputes every second one, counted in the block's forward order
(the router's gate is always recomputed and not counted; the routed experts' grouped
matmuls are not in the save list, so they run again whole). The matmuls run in the
order of `matmul_order`: a Llama block's wqkv, wo, w1, w3, w2 keep wqkv's, w1's and w2's
outputs; DeepSeek's wq_a, wq_b, wkv_a, wkv_b, wo and its shared expert's w1, w3, w2 keep
wq_a's, wkv_a's, wo's and w3's. A matmul's output is as its op's shape says on a rank: a
row-parallel one's partial sum whole, before its reduce-scatter. The sequence-parallel
all-gathers are not saved, so the backward runs them again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.layerops import layer_ops
from ppsim.costs.ops import Op
from ppsim.costs.saved import LAYER_INPUT, microbatch_tokens, saved_tensors, split_over

OP_SAC = "op-sac"
"""The recompute mode: torchtitan's SelectiveAC (`activation-checkpoint:selective`)."""
OP_SAC_MODULE = "torchtitan_op_sac"
"""Its recompute-module name: what a stage policy of this mode recomputes."""
OP_SAC_KINDS = ("dense", "moe")
"""The layers it prices."""

KEPT = (LAYER_INPUT, "attn.out", "attn.lse")
"""Saved tensors the policy keeps as they are: the checkpoint's input and attention's
output and log-sum-exp."""
SAVED_OPS = frozenset({"attention"})
"""Ops other than matmuls whose work the backward does not run again (their output kept)."""


@dataclass(frozen=True)
class TitanMatmul:
    """One of torchtitan's matmuls in a block's forward, as the ppsim op it is part of."""

    op: str
    """The op in ppsim.costs.layerops.layer_ops."""
    half: int = 0
    """0: the whole op; 1, 2: the first or second of a fused pair (w1 and w3 are one
    gated fc1 there)."""


def matmul_order(a: Architecture, kind: str) -> list[TitanMatmul]:
    """The counted matmuls of a layer of `kind`, in torchtitan's forward order (fused QKV,
    its flavours' default; MLA's query and key-value projections; the MLP's w1, w3, w2;
    a MoE block's shared expert, the router's gate and grouped experts not counted)."""
    if a.attention == "mla":
        q = ["q_down", "q_up"] if a.q_lora_rank else ["q_proj"]
        order = [TitanMatmul(op) for op in (*q, "kv_down", "kv_up", "out_proj")]
    else:
        order = [TitanMatmul("qkv"), TitanMatmul("out_proj")]
    ffn = "mlp" if kind == "dense" else "shared" if a.shared_width else ""
    if ffn:
        first = [TitanMatmul(f"{ffn}.fc1", 1), TitanMatmul(f"{ffn}.fc1", 2)] if a.gated_mlp \
            else [TitanMatmul(f"{ffn}.fc1")]
        order += [*first, TitanMatmul(f"{ffn}.fc2")]
    return order


def saved_matmuls(a: Architecture, kind: str) -> list[TitanMatmul]:
    """The matmuls whose outputs the policy saves: the odd ones of matmul_order."""
    return matmul_order(a, kind)[::2]


def op_sac_refusal(model: Mapping[str, Any] | Architecture) -> str:
    """Why a model (an Architecture, or its [model] fields, absent ones at their
    defaults) is not priced under op-sac, or "" where it is: dense and MoE decoder layers
    as torchtitan builds them. Float8 linears save the same: torch's dispatch mode sees
    their matmul (torchao's Float8TrainingTensor's mm) before the subclass does, so the
    count is the same, the outputs are in the training dtype, and the amax of each cast,
    saved too, is a scalar."""
    fields = model if isinstance(model, Mapping) else vars(model)
    reasons = (
        (fields.get("hybrid_layer_pattern") or fields.get("experimental_attention_variant")
         or fields.get("linear_attention_freq"), "hybrid or linear-attention layers"),
        (fields.get("fp8") == "e2m1", "NVFP4 linears (torchtitan trains in no NVFP4 "
         "recipe ppsim prices)"),
        (fields.get("unfused_attention"), "unfused attention"),
        (fields.get("dropout"), "dropout"),
        (fields.get("moe_latent_size") or fields.get("shared_expert_gate")
         or fields.get("attention_output_gate"), "latent MoE projections or gates "
         "(torchtitan's blocks have none)"),
    )
    return next((f"its per-op saves are not priced for {what}" for hit, what in reasons
                 if hit), "")


def _ops(a: Architecture, kind: str) -> dict[str, Op]:
    return {op.name: op for op in layer_ops(a, kind)}


def _output_bytes(a: Architecture, op: Op, half: int) -> float:
    """A matmul's output on a rank, in the training dtype (half a fused pair's)."""
    m, n, _ = op.shape
    return m * n * DTYPE_BYTES[a.dtype] / (2 if half else 1)


def op_sac_kept(a: Architecture, kind: str = "dense") -> dict[str, float]:
    """Name -> bytes per tensor rank a layer keeps from its forward to its backward."""
    saved, ops = saved_tensors(a, kind), _ops(a, kind)
    kept = {n: saved[n] for n in KEPT if n in saved}
    for mm in saved_matmuls(a, kind):
        name = f"{mm.op}.out" + (f"{mm.half}" if mm.half else "")
        kept[name] = _output_bytes(a, ops[mm.op], mm.half)
    tok, w = microbatch_tokens(a), DTYPE_BYTES[a.dtype]
    if kind == "moe":  # top-k's values (fp32) and expert ids (int64), per token
        kept["router.topk"] = tok * a.top_k * (4 + 8) / split_over(a, "router.topk", kind)
        if a.ep > 1:  # the dispatch's and the combine's all-to-all outputs
            kept["a2a.out"] = 2 * saved["experts.fc1_in"] / a.expert_tp
    if a.tp > 1 and a.sequence_parallel:  # the reduce-scatters after attention and the MLP
        kept["reduce_scatter.out"] = 2 * tok * a.hidden_size * w / a.token_ranks
    return kept


@dataclass(frozen=True)
class Repeats:
    """The forward work the backward runs again."""

    whole: frozenset[str]
    """Ops run again whole."""
    halved: frozenset[str]
    """Fused matmuls of which one half runs again."""


def op_sac_repeats(a: Architecture, kind: str) -> Repeats:
    """Every op of the layer but attention's core and the saved matmuls; a fused pair with
    one half saved, the other half."""
    saved = saved_matmuls(a, kind)
    halves = Counter(mm.op for mm in saved if mm.half)
    kept_whole = {mm.op for mm in saved if not mm.half} | {op for op, n in halves.items()
                                                          if n == 2}
    halved = {op for op, n in halves.items() if n == 1}
    whole = set(_ops(a, kind)) - SAVED_OPS - kept_whole - halved
    return Repeats(whole=frozenset(whole), halved=frozenset(halved))


def half_matmul(op: Op) -> Op:
    """One of a fused matmul's two equal halves (w3 of the fused w1 and w3)."""
    m, n, k = op.shape
    return replace(op, name=op.name + ".half", flops=op.flops / 2,
                   shape=(m, max(1, n // 2), k), params=op.params // 2)


def op_sac_transient(saved: dict[str, float], kept: dict[str, float]) -> int:
    """Bytes its recompute brings back inside the backward: the layer's tensors (`saved`:
    saved_tensors) that the policy does not keep (`kept`: op_sac_kept); the recompute
    remakes them all before the layer's backward."""
    return int(max(0.0, sum(saved.values()) - sum(v for n, v in kept.items() if n in saved)))
