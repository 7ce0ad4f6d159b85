"""Context parallelism as Megatron takes it: the sequence's chunks, the attention cores
that take it, and the heads its all-to-alls split (ppsim.job.shape.check runs it)."""

from __future__ import annotations

from typing import Any

from ppsim.costs.hybrid import KIND_SYMBOLS
from ppsim.costs.kv_split import rank_kv_heads
from ppsim.errors import UserError


def cp_refusal(a: Any, cp: int) -> UserError | None:
    """Why Megatron refuses context parallelism of `cp` > 1 for this model, or None: the
    sequence goes in 2 x cp chunks (causal load balancing), and only Transformer Engine's
    attention takes it (the unfused core not). The job search skips those shapes."""
    if a.seq_length % (2 * cp):
        return UserError("model.cp", f"seq_length ({a.seq_length}) is not divisible by 2 x "
                         f"cp ({2 * cp}): causal load balancing splits each sequence in 2 x "
                         "cp chunks", "choose cp so that 2 x cp divides seq_length")
    if a.unfused_attention:
        return UserError("model.cp", "Context parallelism is only supported by "
                         "TEDotProductAttention! (Megatron's assertion; the unfused "
                         "attention core is not)", "use cp = 1, or a fused --attention-backend")
    return None


def check_context_parallel(a: Any) -> None:
    """cp > 1 as Megatron takes it (cp_refusal), under a2a the heads split over cp, under
    a2a+p2p over its all-to-all's ranks; those sizes only with a2a+p2p."""
    if a.cp_a2a_size and a.cp_comm_type != "a2a+p2p":
        raise UserError("model.cp_a2a_size", "sizes the all-to-alls of cp_comm_type a2a+p2p, "
                        f"and it is {a.cp_comm_type}", "add --cp-comm-type a2a+p2p, or drop "
                        "--hierarchical-context-parallel-sizes")
    if a.cp == 1:
        return
    refusal = cp_refusal(a, a.cp)
    if refusal is not None:
        raise refusal
    _sparse_attention_gathers(a)
    if a.cp_comm_type == "a2a":
        _ulysses_heads(a, a.cp)
    if a.cp_comm_type == "a2a+p2p":
        if not a.cp_a2a_size:
            raise UserError("model.cp_a2a_size", "--hierarchical-context-parallel-sizes must "
                            "be set when a2a+p2p is used in cp comm (Megatron's words)",
                            "give --hierarchical-context-parallel-sizes A B, A x B = cp "
                            "(cp_a2a_size = A in [model])")
        if a.cp % a.cp_a2a_size:
            raise UserError("model.cp_a2a_size", f"{a.cp_a2a_size} does not divide cp "
                            f"({a.cp}): the hierarchical sizes multiply to it",
                            "give an all-to-all size that divides cp")
        _ulysses_heads(a, a.cp_a2a_size)


def _sparse_attention_gathers(a: Any) -> None:
    """DeepSeek sparse attention (the variant in every layer, or a hybrid stack's 'D'
    layers) runs its own context parallelism, which gathers the keys alone: Megatron's
    TransformerConfig and DSAttention assert cp_comm_type allgather (all_gather)."""
    if a.cp_comm_type == "all_gather":
        return
    if a.experimental_attention_variant == "dsa" or KIND_SYMBOLS["dsa"] in a.hybrid_layer_pattern:
        raise UserError("model.cp_comm_type", "DSAttention context parallelism currently "
                        "supports cp_comm_type=allgather only. (Megatron's assertion; it "
                        f"is {a.cp_comm_type})", "use --cp-comm-type all_gather, or cp 1")


def _ulysses_heads(a: Any, size: int) -> None:
    """The all-to-all of --cp-comm-type a2a (or a2a+p2p) gives each of its `size` ranks
    1 / size of a tensor rank's query and key/value heads, as Transformer Engine asserts."""
    q, kv = a.num_heads // a.tp, rank_kv_heads(a)
    if q % size or kv % size:
        raise UserError("model.cp_comm_type", f"cp_comm_type='{a.cp_comm_type}' requires "
                        f"num_heads % cp_size == 0 for Q, K, V. Found num_heads_q = {q}, "
                        f"num_heads_kv = {kv}, cp_size = {size}", "use --cp-comm-type p2p or "
                        "all_gather, or an all-to-all size that divides both")
