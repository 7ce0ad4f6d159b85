"""Analytic costs of a decoder-only transformer whose layers may differ in kind.

A model is a stack of decoder layers of kinds "dense" and "moe" (then `mtp_layers`
MTP layers), plus the embedding and the head. Each kind's parameters and FLOPs
follow from its shapes (GQA or MLA attention, gated or plain MLP, routed top-k
experts with shared experts); FLOPs split into F/B/W as in the zero-bubble paper;
activation bytes follow Korthikanti et al. 2022 with each tensor sized for the
actual shapes; static bytes follow Megatron's bytes-per-parameter rule, experts
sharded over ep x tp.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs import LayerCost, ModelCosts
from ppsim.errors import UserError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
RECOMPUTE = ("none", "selective", "full")
KINDS = ("dense", "moe")
ATTENTION = ("gqa", "mla")


@dataclass(frozen=True, kw_only=True)
class Architecture:
    num_layers: int
    """Decoder layers (Megatron's --num-layers; MTP layers not included)."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads (grouped-query attention); equal to num_heads for MHA."""
    ffn_hidden_size: int
    """MLP width of dense layers."""
    vocab_size: int
    seq_length: int
    micro_batch_size: int = 1
    """Sequences per microbatch."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with three matrices (Llama); False for GPT's two."""
    dtype: str = "bf16"
    """Training dtype: bf16, fp16 or fp32."""
    tp: int = 1
    """Tensor-parallel size; sequence parallelism is assumed when tp > 1."""
    recompute: str = "none"
    """"none", "selective" (attention core) or "full" (keep only layer inputs)."""
    distributed_optimizer: bool = False
    """Shard optimizer states over dp (Megatron --use-distributed-optimizer)."""
    dp: int = 1
    """Data-parallel size the distributed optimizer shards over."""
    layers: str = ""
    """Decoder layer kinds in order, e.g. "dense*3, moe*58"; empty: all "moe" when
    num_experts > 0, else all "dense"."""
    mtp_layers: int = 0
    """Multi-token-prediction layers after the decoder (DeepSeek-V3: 1)."""
    head_dim: int = 0
    """Per-head query/key width; 0 means hidden_size / num_heads. For MLA, the
    non-rotary part (qk_nope_head_dim)."""
    attention: str = "gqa"
    """"gqa" (MHA when num_kv_heads = num_heads) or "mla" (DeepSeek's latent attention)."""
    q_lora_rank: int = 0
    """MLA: query compression rank (0: queries projected directly)."""
    kv_lora_rank: int = 0
    """MLA: key/value compression rank."""
    qk_rope_head_dim: int = 0
    """MLA: rotary part of each query/key head."""
    v_head_dim: int = 0
    """MLA: value head width (0: head_dim)."""
    num_experts: int = 0
    """Routed experts per MoE layer."""
    top_k: int = 0
    """Experts each token is routed to."""
    moe_ffn_hidden_size: int = 0
    """Width of each routed (and shared) expert's MLP."""
    shared_experts: int = 0
    """Experts every token passes through (DeepSeek-V3: 1)."""
    ep: int = 1
    """Expert-parallel size: routed experts are divided over ep ranks."""


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    peak_tflops: float
    """Dense peak of the training dtype."""
    efficiency: float = 0.5
    """Achieved fraction of peak for transformer matmuls."""
    a2a_bandwidth_gbps: float = 0.0
    """GB/s each rank sends at in the MoE all-to-all; 0: free."""


def layer_kinds(a: Architecture) -> tuple[str, ...]:
    """The decoder layers' kinds, in order, from the `layers` spec."""
    if not a.layers.strip():
        return ("moe" if a.num_experts else "dense",) * a.num_layers
    out: list[str] = []
    for part in a.layers.split(","):
        name, _, times = part.strip().partition("*")
        name = name.strip()
        if name not in KINDS:
            raise UserError("model.layers", f"unknown layer kind {name!r}",
                            "use dense and moe, e.g. \"dense*3, moe*58\"")
        n = 1
        if times:
            if not times.strip().isascii() or not times.strip().isdigit() or len(times) > 7:
                raise UserError("model.layers", f"bad count {times.strip()!r} for {name}",
                                "write kind*N with N a whole number")
            n = int(times)
        out += [name] * n
        if len(out) > a.num_layers:
            break
    if len(out) != a.num_layers:
        raise UserError("model.layers", f"lists {len(out)} layers but num_layers is "
                        f"{a.num_layers}", "make the kinds add up to num_layers")
    if "moe" in out and not (a.num_experts and a.top_k and a.moe_ffn_hidden_size):
        raise UserError("model.num_experts", "MoE layers need num_experts, top_k and "
                        "moe_ffn_hidden_size", "set all three")
    return tuple(out)


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


def attention_shape(a: Architecture) -> AttentionShape:
    hd = a.head_dim or a.hidden_size // a.num_heads
    if a.attention == "mla":
        qk = a.num_heads * (hd + a.qk_rope_head_dim)
        v = a.num_heads * (a.v_head_dim or hd)
        return AttentionShape(qk, qk, v, v, a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim)
    kv = a.num_kv_heads * hd
    return AttentionShape(a.num_heads * hd, kv, kv, a.num_heads * hd, 0)


def attention_params(a: Architecture) -> tuple[int, int]:
    """(matmul weights, norm weights) of one attention block, input norm included."""
    h, sh = a.hidden_size, attention_shape(a)
    if a.attention == "mla":
        hd = a.head_dim or h // a.num_heads
        q = h * a.q_lora_rank + a.q_lora_rank * sh.q if a.q_lora_rank else h * sh.q
        kv = (h * (a.kv_lora_rank + a.qk_rope_head_dim)
              + a.kv_lora_rank * a.num_heads * (hd + (a.v_head_dim or hd)))
        return q + kv + sh.out * h, h + a.q_lora_rank + a.kv_lora_rank
    return h * (sh.q + sh.k + sh.v) + sh.out * h, h


def _mlp_params(a: Architecture, ffn: int) -> int:
    return a.hidden_size * ffn * (3 if a.gated_mlp else 2)


@dataclass(frozen=True)
class KindParams:
    """Parameter counts of one decoder layer of a kind."""

    dense: int
    """Weights every rank of a tp group holds a 1/tp share of."""
    experts: int
    """Routed expert weights, divided over ep x tp."""
    active: int
    """Weights one token's matmuls touch (FLOPs = 2 x tokens x active)."""


def kind_params(a: Architecture, kind: str) -> KindParams:
    attn, norms = attention_params(a)
    norm = norms + a.hidden_size  # and the MLP's input norm
    if kind == "dense":
        mlp = _mlp_params(a, a.ffn_hidden_size)
        return KindParams(attn + mlp + norm, 0, attn + mlp)
    expert = _mlp_params(a, a.moe_ffn_hidden_size)
    router = a.hidden_size * a.num_experts
    shared = a.shared_experts * expert
    return KindParams(attn + shared + router + norm, a.num_experts * expert,
                      attn + shared + router + a.top_k * expert)


def mtp_extra_params(a: Architecture) -> int:
    """An MTP module beyond its decoder layer: two norms, the 2h -> h projection, a
    final norm (the embedding and the head are shared with the main model)."""
    h = a.hidden_size
    return 2 * h * h + 3 * h


def model_params(a: Architecture) -> tuple[int, int, int]:
    """(total, active per token, MTP) parameters; total and active exclude MTP."""
    kinds = layer_kinds(a)
    embed = a.vocab_size * a.hidden_size
    total = active = 2 * embed + a.hidden_size  # embedding, head, final norm
    for k in kinds:
        p = kind_params(a, k)
        total += p.dense + p.experts
        active += p.active
    last = kind_params(a, kinds[-1]) if kinds else KindParams(0, 0, 0)
    mtp = a.mtp_layers * (last.dense + last.experts + mtp_extra_params(a))
    return total, active, mtp


def bytes_per_param(a: Architecture) -> float:
    """Megatron: weights + grads + Adam states, per parameter."""
    if a.dtype == "fp32":
        return 8 + 8 / a.dp if a.distributed_optimizer else 16
    if a.dtype == "fp16":
        return 4 + 16 / a.dp if a.distributed_optimizer else 20
    return 6 + 12 / a.dp if a.distributed_optimizer else 18


def attention_core_flops(a: Architecture) -> float:
    """QK^T and AV of one microbatch's forward (no causal saving)."""
    sh = attention_shape(a)
    return 2 * a.seq_length ** 2 * a.micro_batch_size * (sh.q + sh.v)


def layer_activation_bytes(a: Architecture, kind: str) -> int:
    """Bytes one microbatch's forward keeps for the backward (Korthikanti et al. 2022,
    each tensor sized for these shapes), per tp rank."""
    s, b, h, t = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp
    sb = s * b
    scale = DTYPE_BYTES[a.dtype] / 2
    if a.recompute == "full":
        return int(2 * sb * h / t * scale)
    sh = attention_shape(a)
    # 16-bit bytes: two norm inputs; attention input, Q, K, V, projection input,
    # dropout mask; the MLP's input and dropout mask.
    per = (2 * sb * (2 * h) + 2 * sb * (h + sh.q + sh.k + sh.v + sh.out + sh.latent)
           + sb * h + 3 * sb * h)
    width = 6 if a.gated_mlp else 4  # per ffn element: fc1 (x2 when gated), activation
    if kind == "dense":
        per += width * sb * a.ffn_hidden_size
    else:
        per += (4 * sb * a.num_experts  # router logits in fp32
                + 2 * sb * a.top_k * h  # tokens dispatched to experts
                + width * sb * a.moe_ffn_hidden_size * (a.top_k + a.shared_experts))
    if a.recompute != "selective":
        per += 5 * a.num_heads * s * s * b
    return int(per / t * scale)


def _kind_cost(a: Architecture, acc: Accelerator, kind: str, rate: float) -> LayerCost:
    s, b, h, t = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp
    p = kind_params(a, kind)
    matmul = 2 * s * b * p.active / t / rate
    attn = attention_core_flops(a) / t / rate
    f, bi, bw = matmul + attn, matmul + 2 * attn, matmul
    if kind == "moe" and a.ep > 1 and acc.a2a_bandwidth_gbps > 0:
        # Dispatch and combine each move top_k copies of every token; (ep-1)/ep leave.
        a2a = 2 * s * b * a.top_k * h * DTYPE_BYTES[a.dtype] * (a.ep - 1) / a.ep / t
        f += a2a / (acc.a2a_bandwidth_gbps * 1e6)
        bi += a2a / (acc.a2a_bandwidth_gbps * 1e6)
    if a.recompute == "full":
        bi += f  # the forward runs again before the backward
    elif a.recompute == "selective":
        bi += attn
    act = layer_activation_bytes(a, kind)
    width = DTYPE_BYTES[a.dtype]
    # ZB: after B only the inputs of the weight matmuls stay for W (32sbh of 34sbh).
    w_keep = min(act, int(32 * s * b * h / t * width / 2))
    static = int((p.dense / t + p.experts / (a.ep * t)) * bytes_per_param(a))
    return LayerCost(forward_ms=f, backward_ms=bi + bw, weight_grad_ms=bw, static_bytes=static,
                     activation_bytes=act, weight_grad_bytes=w_keep,
                     output_bytes=s * b * h * width // t)


def _head_cost(a: Architecture, rate: float) -> LayerCost:
    """Final norm + vocab projection + cross-entropy; logits are vocabulary sized,
    kept in the training dtype and in fp32 for the loss."""
    s, b, h, t, v = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp, a.vocab_size
    width = DTYPE_BYTES[a.dtype]
    mm = 2 * s * b * h * v / t / rate
    return LayerCost(forward_ms=mm, backward_ms=2 * mm, weight_grad_ms=mm,
                     static_bytes=int((v * h / t + h) * bytes_per_param(a)),
                     activation_bytes=int(s * b * h * width / t + s * b * v / t * (width + 4)),
                     weight_grad_bytes=int(s * b * h * width / t), output_bytes=0)


def _mtp_cost(a: Architecture, layer: LayerCost, head: LayerCost, rate: float) -> LayerCost:
    """An MTP module: its projection and decoder layer, then the shared head and a loss."""
    s, b, h, t = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp
    proj = 2 * s * b * 2 * h * h / t / rate
    extra = int(mtp_extra_params(a) / t * bytes_per_param(a))
    width = DTYPE_BYTES[a.dtype]
    return LayerCost(
        forward_ms=layer.forward_ms + proj + head.forward_ms,
        backward_ms=layer.backward_ms + 2 * proj + head.backward_ms,
        weight_grad_ms=layer.weight_grad_ms + proj + head.weight_grad_ms,
        static_bytes=layer.static_bytes + extra,
        activation_bytes=layer.activation_bytes + head.activation_bytes
        + int(2 * s * b * h * width / t),
        weight_grad_bytes=layer.weight_grad_bytes + head.weight_grad_bytes,
        output_bytes=layer.output_bytes)


def transformer_costs(a: Architecture, acc: Accelerator) -> ModelCosts:
    """Per-layer costs of the whole stack, the embedding and the head."""
    s, b, h, t, v = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp, a.vocab_size
    rate = acc.peak_tflops * 1e12 * acc.efficiency / 1e3  # FLOP per ms
    kinds = layer_kinds(a)
    by_kind = {k: _kind_cost(a, acc, k, rate) for k in set(kinds)}
    head = _head_cost(a, rate)
    layers = [by_kind[k] for k in kinds]
    if a.mtp_layers:
        inner = kinds[-1] if kinds else "dense"
        mtp = _mtp_cost(a, by_kind.get(inner) or _kind_cost(a, acc, inner, rate), head, rate)
        layers += [mtp] * a.mtp_layers
    # Embedding: a lookup (no matmul); keeps input ids (8sb) and a dropout mask (sbh).
    emb = LayerCost(forward_ms=0.0, backward_ms=0.0, static_bytes=int(v * h / t *
                    bytes_per_param(a)), activation_bytes=int(8 * s * b + s * b * h / t),
                    output_bytes=s * b * h * DTYPE_BYTES[a.dtype] // t)
    named = kinds + ("mtp",) * a.mtp_layers
    # A stack of dense layers only has one kind: leave it unnamed, as cost files do.
    plain = set(named) <= {"dense"}
    return ModelCosts(layers=tuple(layers), embedding=emb, head=head,
                      kinds=() if plain else named, mtp_layers=a.mtp_layers)
