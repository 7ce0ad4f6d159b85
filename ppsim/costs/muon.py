"""Megatron's Muon (--optimizer muon): its state and its step.

Megatron-LM megatron/core/optimizer/emerging_optimizers.py (TensorParallelMuon) and
layer_wise_optimizer.py: every 2-D weight of the decoder is updated by Muon, which keeps
one fp32 momentum beside the fp32 master weight and orthogonalizes the momentum by
--muon-num-ns-steps (5) Newton-Schulz iterations; the embedding, the output layer and
the 1-D parameters (norms, biases) fall back to Adam (--muon-scalar-optimizer adam).
Under --use-distributed-optimizer each data-parallel rank owns whole weights (the
layer-wise distributed optimizer), so on average a rank steps 1 / (dp x cp) of them, as
the distributed optimizer's shards. --muon-split-qkv (the default) orthogonalizes Q, K and
V apart; --muon-tp-mode duplicated (the default) gathers a tensor-parallel weight's
momentum and orthogonalizes the whole matrix on every tensor rank, blockwise each rank's
shard alone, distributed splits the whole matrix's work over the tensor ranks (its
gathers are not priced). The iterations run at --muon-fp32-matmul-prec medium (the
default): fp32 matmuls at bf16 tensor-core rates.

One Newton-Schulz iteration on an m x n matrix X (m <= n): A = X Xᵀ (2 m² n FLOPs),
B = b A + c A² (2 m³), X = a X + B X (2 m² n).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from ppsim.costs.arch import Architecture
from ppsim.costs.attention_shape import attention_shape
from ppsim.costs.kinds import any_kind_params
from ppsim.costs.ops import Roofline, matmul_ms
from ppsim.costs.stack import layer_kinds
from ppsim.costs.state import ADAM_BYTES_PER_PARAM

MUON_BYTES_PER_PARAM = 20
"""Muon's elementwise traffic per weight: reads the fp32 master, gradient and momentum
(12 B), writes the master and the momentum (8 B); the iterations are matmuls."""


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """One weight Muon orthogonalizes, whole (over tp)."""

    rows: int
    cols: int
    count: int = 1
    split: str = ""
    """The dimension tensor parallelism splits: "rows" (column-parallel), "cols"
    (row-parallel), "" (held whole)."""


def _attention(a: Architecture) -> list[Matrix]:
    h, sh = a.hidden_size, attention_shape(a)
    if a.attention != "mla":
        # Megatron's Muon splits the fused projection into q, its gate, k and v.
        gate = [Matrix(rows=sh.gate, cols=h, split="rows")] if sh.gate else []
        return [Matrix(rows=sh.q, cols=h, split="rows"), *gate,
                Matrix(rows=sh.k, cols=h, split="rows"), Matrix(rows=sh.v, cols=h, split="rows"),
                Matrix(rows=h, cols=sh.out, split="cols")]
    hd = a.head_dim or h // a.num_heads
    q = ([Matrix(rows=a.q_lora_rank, cols=h), Matrix(rows=sh.q, cols=a.q_lora_rank, split="rows")]
         if a.q_lora_rank else [Matrix(rows=sh.q, cols=h, split="rows")])
    kv_up = a.num_heads * (hd + (a.v_head_dim or hd))
    return q + [Matrix(rows=a.kv_lora_rank + a.qk_rope_head_dim, cols=h),
                Matrix(rows=kv_up, cols=a.kv_lora_rank, split="rows"),
                Matrix(rows=h, cols=sh.out, split="cols")]


def _mlp(a: Architecture, ffn: int, width: int = 0, count: int = 1) -> list[Matrix]:
    up = 2 * ffn if a.gated_mlp else ffn
    w = width or a.hidden_size
    return [Matrix(rows=up, cols=w, count=count, split="rows"),
            Matrix(rows=w, cols=ffn, count=count, split="cols")]


def layer_matrices(a: Architecture, kind: str) -> tuple[list[Matrix], list[Matrix]]:
    """(dense, routed experts') weights of one decoder layer of `kind`. A hybrid mixer's
    weights count as one h-wide matrix of their size."""
    h = a.hidden_size
    if kind == "dense":
        return _attention(a) + _mlp(a, a.ffn_hidden_size), []
    if kind == "moe":
        lat = a.moe_latent_size
        dense = _attention(a) + [Matrix(rows=a.num_experts, cols=h)]
        dense += [Matrix(rows=lat, cols=h), Matrix(rows=h, cols=lat)] if lat else []
        if a.shared_width:
            dense += _mlp(a, a.shared_width)
        return dense, _mlp(a, a.moe_ffn_hidden_size, lat, a.num_experts)
    p = any_kind_params(a, kind)
    experts = _mlp(a, a.moe_ffn_hidden_size, a.moe_latent_size, a.num_experts) \
        if p.experts else []
    mats = p.dense - p.norms
    return ([Matrix(rows=h, cols=max(1, mats // h))] if mats > 0 else []), experts


def _iteration_ms(r: Roofline, rows: int, cols: int) -> float:
    m, n = min(rows, cols), max(rows, cols)
    return 2 * matmul_ms(r, m, m, n) + matmul_ms(r, m, m, m)


def _matrix_ms(a: Architecture, r: Roofline, x: Matrix) -> float:
    """One weight's Newton-Schulz time on one tensor rank, per tensor rank's parameter."""
    t = a.tp if x.split else 1
    if a.muon_tp_mode == "blockwise" and x.split:
        rows, cols = (x.rows // t, x.cols) if x.split == "rows" else (x.rows, x.cols // t)
        ms = _iteration_ms(r, max(1, rows), max(1, cols))
    else:
        ms = _iteration_ms(r, x.rows, x.cols) / (t if a.muon_tp_mode == "distributed" else 1)
    return a.muon_ns_steps * ms * x.count


@dataclass(frozen=True, kw_only=True)
class NewtonSchulz:
    """Newton-Schulz ms per weight a rank steps (its tensor-parallel share of a matrix)."""

    dense: float
    experts: float


@functools.lru_cache(maxsize=256)
def newton_schulz(a: Architecture, r: Roofline) -> NewtonSchulz:
    """The model's decoder layers' iteration time over their weights, per rank's
    weight: dense and routed experts' apart (they shard over different groups). Cached:
    every rank of every shape a plan prices asks for its model's."""
    totals = {"dense": [0.0, 0.0], "experts": [0.0, 0.0]}
    for kind, layers in Counter(layer_kinds(a)).items():
        for name, mats in zip(("dense", "experts"), layer_matrices(a, kind), strict=True):
            for x in mats:
                t = a.tp if x.split else 1
                totals[name][0] += layers * _matrix_ms(a, r, x)
                totals[name][1] += layers * x.rows * x.cols * x.count / t
    return NewtonSchulz(**{k: ms / n if n else 0.0 for k, (ms, n) in totals.items()})


def muon_step_ms(a: Architecture, r: Roofline, matrices: float, experts: float,
                 scalars: float, memory_bandwidth_gbps: float) -> float:
    """A rank's step over the weights it owns: `matrices` dense and `experts` routed
    experts' weights by Muon, `scalars` (embedding, output layer) by Adam."""
    ns = newton_schulz(a, r)
    traffic = (matrices + experts) * MUON_BYTES_PER_PARAM + scalars * ADAM_BYTES_PER_PARAM
    memory = traffic / (memory_bandwidth_gbps * 1e6) if memory_bandwidth_gbps > 0 else 0.0
    return memory + ns.dense * matrices + ns.experts * experts
