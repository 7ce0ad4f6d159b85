"""Analytic costs of a decoder-only transformer on a given accelerator.

FLOPs follow the standard decoder formulas (Narayanan et al. 2021; the
zero-bubble paper's F/B/W split); activation bytes follow Korthikanti et
al. 2022; static bytes follow Megatron's bytes-per-parameter rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs import LayerCost, ModelCosts

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class Architecture:
    num_layers: int
    """Decoder layers."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads (grouped-query attention); equal to num_heads for MHA."""
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    micro_batch_size: int = 1
    gated_mlp: bool = True
    """SwiGLU-style MLP with three matrices (Llama); False for GPT's two."""
    dtype: str = "bf16"
    tp: int = 1
    """Tensor-parallel size; sequence parallelism is assumed when tp > 1."""
    recompute: str = "none"
    """"none", "selective" (attention core) or "full" (keep only layer inputs)."""
    distributed_optimizer: bool = False
    dp: int = 1
    """Data-parallel size the distributed optimizer shards over."""


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    peak_tflops: float
    """Dense peak of the training dtype."""
    efficiency: float = 0.5
    """Achieved fraction of peak for transformer matmuls."""


def layer_params(a: Architecture) -> int:
    h = a.hidden_size
    kv = h * a.num_kv_heads // a.num_heads
    attn = h * (h + 2 * kv) + h * h
    mlp = h * a.ffn_hidden_size * (3 if a.gated_mlp else 2)
    return attn + mlp + 2 * h  # two norms


def bytes_per_param(a: Architecture) -> float:
    """Megatron: weights + grads + Adam states, per parameter."""
    if a.dtype == "fp32":
        return 8 + 8 / a.dp if a.distributed_optimizer else 16
    if a.dtype == "fp16":
        return 4 + 16 / a.dp if a.distributed_optimizer else 20
    return 6 + 12 / a.dp if a.distributed_optimizer else 18


def layer_flops(a: Architecture) -> tuple[float, float, float]:
    """(forward, backward for inputs, backward for weights) FLOPs of one layer."""
    s, b, h = a.seq_length, a.micro_batch_size, a.hidden_size
    kv = h * a.num_kv_heads // a.num_heads
    matmul = 2 * s * b * (h * (h + 2 * kv) + h * h + h * a.ffn_hidden_size
                          * (3 if a.gated_mlp else 2))
    attn = 4 * s * s * b * h  # QK^T and AV
    return matmul + attn, matmul + 2 * attn, matmul


def layer_activation_bytes(a: Architecture) -> int:
    """Korthikanti et al. 2022, per layer per microbatch, scaled from 16-bit."""
    s, b, h, t = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp
    scale = DTYPE_BYTES[a.dtype] / 2
    if a.recompute == "full":
        return int(2 * s * b * h / t * scale)
    per = 34 * s * b * h
    if a.recompute != "selective":
        per += 5 * a.num_heads * s * s * b
    return int(per / t * scale)


def transformer_costs(a: Architecture, acc: Accelerator) -> ModelCosts:
    s, b, h, t, v = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp, a.vocab_size
    rate = acc.peak_tflops * 1e12 * acc.efficiency / 1e3  # FLOP per ms
    f, bi, bw = (x / t / rate for x in layer_flops(a))
    if a.recompute == "full":
        bi += f  # the forward runs again before the backward
    elif a.recompute == "selective":
        bi += 4 * s * s * b * h / t / rate
    act = layer_activation_bytes(a)
    width = DTYPE_BYTES[a.dtype]
    hidden = s * b * h * width // (t if t > 1 else 1)
    # ZB: after B only the inputs of the weight matmuls stay for W (32sbh of 34sbh).
    w_keep = min(act, int(32 * s * b * h / t * width / 2))
    static = int(layer_params(a) / t * bytes_per_param(a))
    layer = LayerCost(forward_ms=f, backward_ms=bi + bw, weight_grad_ms=bw, static_bytes=static,
                      activation_bytes=act, weight_grad_bytes=w_keep, output_bytes=hidden)
    # Embedding: a lookup (no matmul); keeps input ids (8sb) and a dropout mask (sbh).
    emb = LayerCost(forward_ms=0.0, backward_ms=0.0, static_bytes=int(v * h / t *
                    bytes_per_param(a)), activation_bytes=int(8 * s * b + s * b * h / t),
                    output_bytes=hidden)
    # Head: final norm + vocab projection + cross-entropy; logits are vocabulary
    # sized, kept in the training dtype and in fp32 for the loss.
    head_mm = 2 * s * b * h * v / t / rate
    head = LayerCost(forward_ms=head_mm, backward_ms=2 * head_mm, weight_grad_ms=head_mm,
                     static_bytes=int((v * h / t + h) * bytes_per_param(a)),
                     activation_bytes=int(s * b * h * width / t + s * b * v / t * (width + 4)),
                     weight_grad_bytes=int(s * b * h * width / t), output_bytes=0)
    return ModelCosts(layers=(layer,) * a.num_layers, embedding=emb, head=head)
