"""How tensor parallelism splits grouped-query attention's key/value groups (Megatron's
SelfAttention, megatron/core/transformer/attention.py). At tp dividing the groups each
rank holds groups / tp of them. At tp a multiple of the groups (tp > groups) the QKV
projection still splits its whole output evenly over the ranks, no weight repeated; its
output is all-gathered along the width (all_gather_last_dim_from_tensor_parallel_region,
whose backward reduce-scatters the gradient) and each rank slices one whole group: its
key and value head, and num_heads / tp of the group's query heads (and output gates).
Pure: no I/O, no torch."""

from __future__ import annotations

from dataclasses import replace

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.attention_shape import AttentionShape, attention_shape


def kv_split_problem(groups: int, tp: int) -> str | None:
    """What Megatron refuses of `groups` key/value groups over `tp` ranks (neither divides
    the other), in its words, or None."""
    if groups % tp == 0 or tp % groups == 0:
        return None
    return (f"num_query_groups ({groups}) must be a multiple or divisor of "
            f"tensor_model_parallel_size ({tp})")


def qkv_width_problem(heads: int, groups: int, head_dim: int, gate: bool,
                      tp: int) -> str | None:
    """Above the groups the QKV projection's whole width, (np (x 2 with an output gate) +
    2 ng) x hn, splits evenly over the tp ranks (ColumnParallelLinear's `divide`): what
    is wrong, or None."""
    if tp <= groups:
        return None
    width = (heads * (2 if gate else 1) + 2 * groups) * head_dim
    if width % tp == 0:
        return None
    return (f"the interleaved QKV projection's {width:,} outputs do not divide by tp ({tp}), "
            "which Megatron splits them over")


def gathers_qkv(a: Architecture) -> bool:
    """Megatron all-gathers the QKV projection's output: GQA at tp above the groups."""
    return a.attention != "mla" and a.tp > a.num_kv_heads


def kv_copies(a: Architecture) -> int:
    """Tensor ranks holding each key/value head: tp / groups where tp exceeds the groups
    (each rank one whole group), else 1."""
    return a.tp // a.num_kv_heads if gathers_qkv(a) else 1


def rank_kv_heads(a: Architecture, tp: int = 0) -> int:
    """Key/value heads one of `tp` (default the model's) tensor ranks attends with (MLA:
    one a query head)."""
    tp = tp or a.tp
    if a.attention == "mla":
        return a.num_heads // tp
    return max(1, a.num_kv_heads // tp)


def held_attention_shape(a: Architecture) -> AttentionShape:
    """attention_shape with the keys and values as the tensor ranks hold them between
    them (each rank 1 / tp of it): kv_copies times the whole at tp above the groups. The
    projection's weights and output are the whole's (attention_shape)."""
    sh, n = attention_shape(a), kv_copies(a)
    return sh if n == 1 else replace(sh, k=sh.k * n, v=sh.v * n)


def qkv_gather_bytes(a: Architecture) -> float:
    """The gathered QKV projection output of one microbatch (what the all-gather
    assembles on each rank, and its gradient's reduce-scatter starts from): every token
    of the rank's sequence (under sequence parallelism the projection's input was
    gathered already) at the projection's whole width, (np + 2 ng) x hn plus the output
    gate's np x hn, in the training dtype; 0 where nothing is gathered."""
    if not gathers_qkv(a):
        return 0.0
    sh = attention_shape(a)
    return a.seq_length * a.micro_batch_size * (sh.q + sh.k + sh.v + sh.gate) \
        * DTYPE_BYTES[a.dtype]
