"""Analytic costs of a decoder-only transformer whose layers may differ in kind.

A model is a stack of decoder layers of kinds "dense" and "moe" (then `mtp_layers`
MTP layers), plus the embedding and the head (ppsim.arch holds the shapes). Time
is a per-op roofline (ppsim.ops, ppsim.layerops): each op's forward, input
gradient and weight gradient, matmuls at a size-dependent efficiency, attention
at FlashAttention's causal FLOPs, the rest bytes over memory bandwidth. Activation
bytes are the tensors autograd keeps; static bytes follow Megatron's
bytes-per-parameter rule with a padded vocabulary, norms whole on every tp rank
and experts sharded over ep x etp.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.attention_shape import AttentionShape, attention_shape
from ppsim.costs.choices import ATTENTION, NORMS, POSITIONS, RECOMPUTE
from ppsim.costs.fp8 import (
    fp8_bytes,
    fp8_layers,
    fp8_weight_bytes,
    layer_precision,
    mtp_layers_fp8,
    mtp_precision,
    saved_weight_bytes,
    transposed_weight_bytes,
)
from ppsim.costs.kinds import any_kind_params, kind_effect, kind_ops, model_params, mtp_kinds
from ppsim.costs.layerops import (
    embedding_activation_bytes,
    head_activation_bytes,
    head_ops,
    head_transient_bytes,
    mtp_ops,
    padded_vocab,
)
from ppsim.costs.model import LAYER_FIELDS, LayerCost, ModelCosts
from ppsim.costs.modules import SHORTHAND, layer_activation_bytes
from ppsim.costs.ops import Op, Roofline, op_times, piece_times
from ppsim.costs.params import KindParams, attention_params, kind_params, mtp_extra_params
from ppsim.costs.stack import KINDS, layer_kinds, layer_windows
from ppsim.costs.state import bytes_per_param
from ppsim.errors import UserError

__all__ = ["ATTENTION", "DTYPE_BYTES", "KINDS", "NORMS", "POSITIONS", "RECOMPUTE",
           "Accelerator", "Architecture", "accelerator", "AttentionShape", "KindParams",
           "attention_params",
           "attention_shape", "bytes_per_param", "kind_params", "layer_activation_bytes",
           "layer_kinds", "model_params", "mtp_extra_params", "transformer_costs"]


@dataclass(frozen=True, kw_only=True)
class Accelerator(Roofline):
    """A device's roofline, and the rate its ranks send at in the MoE all-to-all."""

    a2a_bandwidth_gbps: float = 0.0
    """GB/s each rank sends at in the MoE all-to-all; 0: free."""

    def roofline(self) -> Roofline:
        return Roofline(**{f.name: getattr(self, f.name) for f in fields(Roofline)})


def accelerator(hw: Any) -> Accelerator:
    """The Accelerator of a [hardware] table (ppsim.config.HardwareConfig)."""
    curve = []
    for pt in hw.matmul_efficiency or []:
        if (not isinstance(pt, list) or len(pt) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in pt)
                or pt[0] <= 0 or not 0 < pt[1] <= 1):
            raise UserError("hardware.matmul_efficiency", f"bad point {pt!r}",
                            "write [[GFLOP, fraction of peak], ...], e.g. [[1, 0.2], [1000, 0.8]]")
        curve.append((float(pt[0]), float(pt[1])))
    for name in ("attention_efficiency", "memory_bandwidth_gbps", "kernel_overhead_us"):
        if getattr(hw, name) < 0:
            raise UserError(f"hardware.{name}", "must not be negative", "use 0 or more")
    return Accelerator(peak_tflops=hw.peak_tflops, efficiency=hw.efficiency,
                       a2a_bandwidth_gbps=hw.p2p_bandwidth_gbps, matmul_efficiency=tuple(curve),
                       attention_efficiency=hw.attention_efficiency,
                       memory_bandwidth_gbps=hw.memory_bandwidth_gbps,
                       kernel_overhead_us=hw.kernel_overhead_us,
                       fp8_peak_tflops=getattr(hw, "fp8_peak_tflops", 0.0),
                       fp8_efficiency_ratio=getattr(hw, "fp8_efficiency_ratio", 1.0),
                       fp4_peak_tflops=getattr(hw, "fp4_peak_tflops", 0.0),
                       fp4_efficiency_ratio=getattr(hw, "fp4_efficiency_ratio", 1.0))


@dataclass(frozen=True)
class HeldParams:
    """Parameters one rank holds of a layer."""

    dense: float
    """Matrices split by tp, norms whole."""
    experts: float
    """Routed experts, split by ep x etp."""


def held_params(a: Architecture, kind: str) -> HeldParams:
    """One rank's parameters of a layer of `kind`."""
    p = any_kind_params(a, kind)
    whole = p.norms + p.duplicated
    return HeldParams(dense=(p.dense - whole) / a.tp + whole,
                      experts=p.experts / (a.ep * a.expert_tp))


def _kind_cost(a: Architecture, acc: Accelerator, kind: str,
               recompute: tuple[str, ...] | None = None, full: bool | None = None,
               window: int = 0) -> LayerCost:
    """One layer of `kind` attending over `window` (0: all the keys before a query);
    `recompute` (Megatron module names) and `full` (the whole layer recomputed) default
    to the architecture's global mode."""
    work = _kind_work(_state_free(a), acc, kind, recompute, full, window)
    return replace(work.cost, static_bytes=_state_bytes(a, kind) + work.fp8_weight_bytes)


@dataclass(frozen=True, kw_only=True)
class _KindWork:
    """A layer's cost but for the state its rank holds."""

    cost: LayerCost
    """Its times and activations (static_bytes 0)."""
    fp8_weight_bytes: int
    """Its FP8 weight copies (ppsim.costs.fp8.fp8_weight_bytes)."""


@lru_cache(maxsize=1024)
def _state_free(a: Architecture) -> Architecture:
    """`a` with one data-parallel rank: outside FSDP, dp reaches a layer's cost only
    through the optimizer's shards (_state_bytes), so shapes that differ in dp alone (a
    job search's) price their layers once; under FSDP the FP8 weight shards read it
    too."""
    if a.fsdp or (a.dp == 1 and a.dp_replicas == 1):
        return a
    return replace(a, dp=1, dp_replicas=1)


def _state_bytes(a: Architecture, kind: str) -> int:
    """The weights, gradients and optimizer state one rank holds of a layer of `kind`
    (Megatron's bytes per parameter; Muon steps the matrices, Adam the norms)."""
    held = held_params(a, kind)
    norms = any_kind_params(a, kind).norms if a.optimizer == "muon" else 0
    return int((held.dense - norms) * bytes_per_param(a, layer=True)
               + norms * bytes_per_param(a)
               + held.experts * bytes_per_param(a, experts=True, layer=True))


@lru_cache(maxsize=4096)
def _kind_work(a: Architecture, acc: Accelerator, kind: str,
               recompute: tuple[str, ...] | None, full: bool | None,
               window: int) -> _KindWork:
    """_kind_cost's work: everything but _state_bytes (cached: its arguments are
    frozen)."""
    s, b, h, t = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp
    if full is None:
        full = a.recompute == "full"
    if recompute is None:
        recompute = SHORTHAND.get(a.recompute, ())
    ops = kind_ops(a, kind, window)
    roof = acc.roofline()
    f, bi, bw = piece_times(roof, ops)
    transposes = transposed_weight_bytes(a, ops)
    if transposes:  # made in the backward, after its gather (Megatron-FSDP's FP8 weights)
        bi += op_times(roof, Op("fp8.weight_transposes", nbytes=transposes))[0]
    a2a = 0.0
    if kind in ("moe", "moe-mlp", "gdn-moe") and a.ep > 1 and acc.a2a_bandwidth_gbps > 0:
        # Dispatch and combine each move top_k copies of every token; (ep-1)/ep leave.
        a2a = 2 * s * b * a.top_k * a.expert_load * (a.moe_latent_size or h) \
            * DTYPE_BYTES[a.dtype] * (a.ep - 1) / a.ep / t
        a2a /= acc.a2a_bandwidth_gbps * 1e6
        f += a2a
        bi += a2a
    effect = kind_effect(a, kind, recompute, full=full)
    act, repeated, transient = effect.kept_bytes, effect.repeated_ops, effect.transient_bytes
    if full or effect.whole_checkpoint:  # its weight copies live inside the recompute alone
        transient += saved_weight_bytes(a, ops)
    else:
        act += saved_weight_bytes(a, ops)
    if full:
        bi += f  # the forward runs again before the backward
    elif repeated:  # the recomputed modules' forward ops run again inside the backward
        bi += piece_times(roof, effect.ops_again(ops))[0]
        bi += a2a if "a2a" in repeated else 0.0
    w_keep = min(act, weight_grad_bytes(a, ops, inputs=True)) \
        + weight_grad_bytes(a, ops, inputs=False)
    held = held_params(a, kind)
    cost = LayerCost(forward_ms=f, backward_ms=bi + bw, weight_grad_ms=bw,
                     activation_bytes=act, weight_grad_bytes=w_keep, transient_bytes=transient,
                     output_bytes=s * b * h * a.residual_bytes // a.token_ranks,
                     params=int(held.dense + held.experts), expert_params=int(held.experts))
    return _KindWork(cost=cost, fp8_weight_bytes=fp8_weight_bytes(a, ops))


def weight_grad_bytes(a: Architecture, ops: list[Op], inputs: bool) -> int:
    """ZB: what W still needs after B, per weight matmul: its input (`inputs`) or the
    gradient of its output B computed (the rest of what the forward kept is freed).
    Zero-bubble's WeightGradStore queues both with each deferred matmul (a quantized
    matmul's quantized copies, at fp8_bytes an element)."""
    quantized, plain = fp8_bytes(a), DTYPE_BYTES[a.dtype]
    return int(sum(op.shape[0] * (op.shape[2] if inputs else op.shape[1])
                   * (quantized if op.fp8 else plain) for op in ops if op.params))


def _head_cost(a: Architecture, acc: Accelerator) -> LayerCost:
    """Final norm + vocab projection + cross-entropy in fp32."""
    h, t, ops = a.hidden_size, a.tp, head_ops(a)
    f, bi, bw = piece_times(acc.roofline(), ops)
    norm = h * (1 if a.rmsnorm else 2)
    # W keeps the vocabulary projection's input and its logits' gradient.
    w_keep = sum(weight_grad_bytes(a, ops, inputs) for inputs in (True, False))
    if a.loss_chunks:  # torchtitan runs the head's backward chunk by chunk in the forward
        _, nbi, nbw = piece_times(acc.roofline(), [op for op in ops
                                                   if op.name.startswith("final_norm")])
        f, bi, bw, w_keep = f + bi - nbi + bw - nbw, nbi, nbw, 0  # the norm's stays in B
    return LayerCost(forward_ms=f, backward_ms=bi + bw, weight_grad_ms=bw,
                     static_bytes=int((padded_vocab(a) * h / t + norm) * bytes_per_param(a)),
                     activation_bytes=head_activation_bytes(a), weight_grad_bytes=w_keep,
                     transient_bytes=head_transient_bytes(a), output_bytes=0,
                     params=int(padded_vocab(a) * h / t + norm))


def _mtp_cost(a: Architecture, acc: Accelerator, layer: LayerCost,
              head: LayerCost) -> LayerCost:
    """An MTP module: its norms and projection, its decoder layer, the shared head, a loss."""
    s, b, h, t = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp
    ops = mtp_ops(a)
    f, bi, bw = piece_times(acc.roofline(), ops)
    # eh_proj's FP8 weight copies, as a layer's TE linears keep theirs
    extra = int(mtp_extra_params(a) / t * bytes_per_param(a, layer=True)) \
        + fp8_weight_bytes(mtp_precision(a), ops)
    width = DTYPE_BYTES[a.dtype]
    return LayerCost(
        forward_ms=layer.forward_ms + f + head.forward_ms,
        backward_ms=layer.backward_ms + bi + bw + head.backward_ms,
        weight_grad_ms=layer.weight_grad_ms + bw + head.weight_grad_ms,
        static_bytes=layer.static_bytes + extra,
        activation_bytes=layer.activation_bytes + head.activation_bytes
        + int(2 * s * b * h * width / a.token_ranks),
        weight_grad_bytes=layer.weight_grad_bytes + head.weight_grad_bytes,
        transient_bytes=max(layer.transient_bytes, head.transient_bytes),
        output_bytes=layer.output_bytes, params=layer.params + int(mtp_extra_params(a) / t),
        expert_params=layer.expert_params)


def _chain(parts: list[LayerCost]) -> LayerCost:
    """Layers run one after another as one piece (a hybrid MTP depth's pattern)."""
    if len(parts) == 1:
        return parts[0]
    total = {f: sum(getattr(p, f) for p in parts) for f in LAYER_FIELDS}
    return LayerCost(**{**total, "output_bytes": parts[-1].output_bytes,
                        "split_backward_ms": 0.0,
                        "transient_bytes": max(p.transient_bytes for p in parts)})


def transformer_costs(a: Architecture, acc: Accelerator, recompute: tuple[str, ...] | None = None,
                      full: bool | None = None) -> ModelCosts:
    """Per-layer costs of the whole stack, the embedding and the head; every decoder
    layer recomputes the `recompute` modules (or the whole layer, `full`), by default
    the architecture's global mode (ppsim.costs.modules)."""
    s, b, h, t = a.seq_length, a.micro_batch_size, a.hidden_size, a.tp
    kinds = layer_kinds(a)
    pieces = list(zip(kinds, layer_windows(a), fp8_layers(a), strict=True))
    by_kind = {p: _kind_cost(layer_precision(a, p[2]), acc, p[0], recompute, full, p[1])
               for p in set(pieces)}
    head = _head_cost(a, acc)
    layers = [by_kind[p] for p in pieces]
    # Embedding: a lookup (no matmul); its backward scatters gradients into the table.
    # Learned positions add a table of their own, whole on every tensor rank.
    words = int(padded_vocab(a) * h / t)
    word_bytes = int(words * bytes_per_param(a))
    positions = a.position_params
    emb = LayerCost(forward_ms=0.0, backward_ms=0.0,
                    static_bytes=word_bytes + int(positions * bytes_per_param(a)),
                    activation_bytes=embedding_activation_bytes(a),
                    output_bytes=s * b * h * a.residual_bytes // a.token_ranks,
                    params=words + positions)
    copy = LayerCost()  # the first MTP layer's stage keeps its own copy of the word table
    if a.mtp_layers:
        copy = LayerCost(static_bytes=word_bytes)
        depth = mtp_kinds(a)
        inner = [by_kind.get((k, 0, q))
                 or _kind_cost(layer_precision(a, q), acc, k, recompute, full)
                 for k, q in zip(depth, mtp_layers_fp8(a, len(depth)), strict=True)]
        mtp = _mtp_cost(a, acc, _chain(inner), head)
        layers += [replace(mtp, static_bytes=mtp.static_bytes + copy.static_bytes)]
        layers += [mtp] * (a.mtp_layers - 1)
    named = kinds + ("mtp",) * a.mtp_layers
    # A stack of dense layers only has one kind: leave it unnamed, as cost files do.
    plain = set(named) <= {"dense"}
    tied = LayerCost(static_bytes=word_bytes, params=words) if a.tie_embeddings else LayerCost()
    return ModelCosts(layers=tuple(layers), embedding=emb, head=head,
                      kinds=() if plain else named, mtp_layers=a.mtp_layers, tied=tied,
                      mtp_embedding=copy)
