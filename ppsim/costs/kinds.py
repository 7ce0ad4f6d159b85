"""What a layer of any kind costs, by its kind: a transformer's decoder layer ("dense",
"moe"; ppsim.costs.layerops and ppsim.costs.modules), a hybrid stack's layer (its mixer
or half; ppsim.costs.mixers), a GPT model's attention-variant layer (PAIRED_KINDS: its
mixer's and its MLP or MoE block's together), an MTP module's layers (piece_kinds)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ppsim.costs.arch import Architecture
from ppsim.costs.hybrid import parse_pattern
from ppsim.costs.layerops import head_ops, layer_ops, mtp_ops
from ppsim.costs.mixers import (
    mixer_activation_bytes,
    mixer_ops,
    mixer_params,
)
from ppsim.costs.modules import ModuleEffect, layer_activation_bytes, module_effect
from ppsim.costs.ops import Op, Roofline, op_times
from ppsim.costs.params import KindParams, kind_params, mtp_extra_params
from ppsim.costs.saved import HYBRID_HALVES
from ppsim.costs.stack import KINDS, PAIRED_KINDS, layer_kinds
from ppsim.costs.state import landed


def any_kind_params(a: Architecture, kind: str) -> KindParams:
    """kind_params for the transformer kinds, mixer_params for the hybrid ones, their
    sum for an attention-variant decoder layer's (PAIRED_KINDS)."""
    if kind in PAIRED_KINDS:
        parts = [mixer_params(a, k) for k in PAIRED_KINDS[kind]]
        return KindParams(*(sum(getattr(p, f) for p in parts) for f in
                            ("dense", "experts", "active", "norms", "duplicated")))
    return kind_params(a, kind) if kind in KINDS else mixer_params(a, kind)


@dataclass(frozen=True)
class ModelParams:
    """A whole model's parameter counts."""

    total: int
    """Every weight but MTP's: the layers, the embedding, the head (none of its own when
    tied) and the final norm."""
    active: int
    """Those one token's pass touches (its top-k experts of each MoE layer)."""
    mtp: int
    """The MTP depths' layers (mtp_kinds) and their own weights."""


def model_params(a: Architecture) -> ModelParams:
    """The parameters of any stack."""
    kinds = layer_kinds(a)
    tables = 1 if a.tie_embeddings else 2  # a tied head is the embedding's table
    total = active = tables * a.vocab_size * a.hidden_size + a.hidden_size + a.position_params
    for k in kinds:
        p = any_kind_params(a, k)
        total += p.dense + p.experts
        active += p.active
    depths = parse_pattern(a.hybrid_layer_pattern).mtp_depths if a.hybrid_layer_pattern \
        else a.mtp_layers
    depth = sum(p.dense + p.experts for p in (any_kind_params(a, k) for k in mtp_kinds(a))) \
        if kinds else 0
    return ModelParams(total, active, depths * (depth + mtp_extra_params(a)))


def mtp_kinds(a: Architecture) -> tuple[str, ...]:
    """The kinds one MTP depth runs: the pattern's MTP part, else the last layer's kind."""
    if a.hybrid_layer_pattern:
        return parse_pattern(a.hybrid_layer_pattern).mtp_kinds
    kinds = layer_kinds(a)
    return (kinds[-1] if kinds else "dense",)


def piece_kinds(a: Architecture, kind: str) -> tuple[str, ...]:
    """The layer kinds a piece of `kind` runs: an MTP module's decoder layers (mtp_kinds,
    each expanded), an attention-variant layer's mixer and MLP or MoE block (PAIRED_KINDS), or
    the one layer."""
    if kind == "mtp":
        return tuple(k for m in mtp_kinds(a) for k in piece_kinds(a, m))
    return PAIRED_KINDS.get(kind, (kind,))


def kind_ops(a: Architecture, kind: str, window: int = 0) -> list[Op]:
    """layer_ops for the transformer kinds (attending over `window`), mixer_ops for the
    hybrid ones, one after the other for an attention-variant layer's (PAIRED_KINDS); their
    gradients landed as the sharding lands them (ppsim.costs.state.landed)."""
    if kind in PAIRED_KINDS:
        return landed(a, [op for k in PAIRED_KINDS[kind] for op in mixer_ops(a, k)])
    return landed(a, layer_ops(a, kind, window) if kind in KINDS else mixer_ops(a, kind))


GATHERED_LINEARS = {"qkv": "attention", "q_proj": "attention", "q_up": "attention",
                    "kv_up": "attention", "mlp.fc1": "mlp", "shared.fc1": "shared",
                    "mamba.in_proj": "mamba", "gdn.in_proj": "gdn"}
"""The column-parallel linears whose input a sequence-parallel sublayer gathers, by op
name, and the sublayer each belongs to: the QKV projection (MLA's query and key/value
up-projections, whose down-projections run over the rank's own tokens), the MLP's fc1, a
MoE block's shared experts' fc1 (Megatron's SharedExpertMLP), a Mamba or GatedDeltaNet
mixer's in_proj."""


@dataclass(frozen=True, kw_only=True)
class GemmWindow:
    """One sequence-parallel sublayer's gathered linears' backward GEMMs, ms."""

    input_grad_ms: float
    """dX = dY W^T: Megatron gathers the linears' input again beside it."""
    weight_grad_ms: float
    """dW = X^T dY: Megatron reduce-scatters the input's gradient beside it."""


@lru_cache(maxsize=1024)
def gathered_gemm_windows(a: Architecture, r: Roofline, kind: str,
                          shared: bool = True) -> tuple[GemmWindow, ...]:
    """The backward GEMMs of each sublayer of a layer of `kind` whose linears take the
    sequence-parallel gather (GATHERED_LINEARS), in the layer's order, priced as the
    layer's compute is (op_times: the matmul curve, FP8 where the ops run it): the
    compute Megatron's LinearWithGradAccumulationAndAsyncCommunication and Transformer
    Engine's linears run their async backward collectives beside. A MoE layer's routed
    experts take the dispatcher's tokens, no such gather; its shared experts' fc1 is
    one unless not `shared` (--moe-shared-expert-overlap strips it of its collectives:
    ppsim.job.shared_tp)."""
    windows: dict[str, GemmWindow] = {}
    for op in kind_ops(a, kind):
        sublayer = GATHERED_LINEARS.get(op.name)
        if sublayer is None or (sublayer == "shared" and not shared):
            continue
        _, dgrad, wgrad, _, _ = op_times(r, op)
        had = windows.get(sublayer, GemmWindow(input_grad_ms=0.0, weight_grad_ms=0.0))
        windows[sublayer] = GemmWindow(input_grad_ms=had.input_grad_ms + dgrad,
                                       weight_grad_ms=had.weight_grad_ms + wgrad)
    return tuple(windows.values())


@lru_cache(maxsize=256)
def head_gemm_window(a: Architecture, r: Roofline) -> GemmWindow:
    """The output layer's backward GEMMs (head_ops' vocabulary projection), priced as the
    head's compute is: Megatron's output layer is a ColumnParallelLinear, whose backward
    runs its collectives beside them as a layer's gathered linears do (a fused or
    vocabulary-parallel cross-entropy changes the logits' gradient, not the linear)."""
    (op,) = (op for op in head_ops(a) if op.name == "output")
    return _window(r, op)


@lru_cache(maxsize=256)
def mtp_gemm_window(a: Architecture, r: Roofline) -> GemmWindow:
    """An MTP depth's 2h -> h projection's backward GEMMs (mtp_ops' eh_proj, a
    column-parallel linear), priced as the depth's compute is."""
    (op,) = (op for op in mtp_ops(a) if op.name == "mtp.proj")
    return _window(r, op)


def _window(r: Roofline, op: Op) -> GemmWindow:
    _, dgrad, wgrad, _, _ = op_times(r, op)
    return GemmWindow(input_grad_ms=dgrad, weight_grad_ms=wgrad)


def kind_effect(a: Architecture, kind: str, recompute: tuple[str, ...] = (),
                offload: tuple[str, ...] = (), full: bool = False) -> ModuleEffect:
    """module_effect for a layer of any kind: a Mamba or GatedDeltaNet layer has no
    modules, so it keeps all its tensors, or only its input when recomputed whole; a
    GPT model's attention-variant layer its two parts' (recomputed whole, its input alone)."""
    if kind in PAIRED_KINDS:
        return _paired_layer_effect(a, kind, recompute, offload, full)
    if kind in KINDS or kind in HYBRID_HALVES:
        return module_effect(a, kind, recompute, offload, full)
    whole = mixer_activation_bytes(replace(a, recompute="none"), kind)
    kept = mixer_activation_bytes(replace(a, recompute="full"), kind) if full else whole
    return ModuleEffect(kept_bytes=kept, offloaded_bytes=0, freed_bytes=0,
                        repeated_ops=frozenset({"*"}) if full else frozenset(),
                        whole_checkpoint=full,
                        transient_bytes=whole - kept)


def _paired_layer_effect(a: Architecture, kind: str, recompute: tuple[str, ...],
                         offload: tuple[str, ...], full: bool) -> ModuleEffect:
    parts = [kind_effect(a, k, recompute, offload, full) for k in PAIRED_KINDS[kind]]
    if full:  # Megatron recomputes the decoder layer whole from its input alone
        whole = sum(p.kept_bytes + p.transient_bytes for p in parts)
        return replace(parts[0], transient_bytes=whole - parts[0].kept_bytes)
    return ModuleEffect(kept_bytes=sum(p.kept_bytes for p in parts),
                        offloaded_bytes=sum(p.offloaded_bytes for p in parts),
                        freed_bytes=sum(p.freed_bytes for p in parts),
                        repeated_ops=frozenset().union(*(p.repeated_ops for p in parts)),
                        transient_bytes=max(p.transient_bytes for p in parts))


def kind_activation_bytes(a: Architecture, kind: str) -> int:
    """layer_activation_bytes for the transformer kinds, the mixers' for the hybrid ones."""
    if kind in PAIRED_KINDS:
        return kind_effect(a, kind, full=a.recompute == "full").kept_bytes
    return layer_activation_bytes(a, kind) if kind in KINDS else mixer_activation_bytes(a, kind)
