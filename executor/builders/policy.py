"""A memory policy on a stage's layers: per-module recompute, block N, offload.

Modules are found by their role in a layer (Megatron's names): the GPT block's
norm1 / q, kv / attention / proj / norm2 and the Llama layer's attn_norm /
attention.q, k, v (MLA: q_down, kv_down, k_rope; up, its mla_up_proj) / attention.core /
attention.o / mlp_norm / mlp; a hybrid layer's norm and mixer play one half's. A norm
Megatron fuses into the next linear (all but an MLA layer's input norm and a MoE layer's
pre-MLP norm) plays no role: `layernorm` and the norm offloads leave it alone. Recompute
checkpoints the module (torch.utils.checkpoint, non-reentrant: its inputs kept,
its internals recomputed in the backward); block N checkpoints the stage's first N
layers whole. Offload runs a module's forward under saved-tensor hooks that move
every non-parameter tensor it saves to host memory (pinned on CUDA; on CPU a
separate buffer, so the path is exercised) and back when the backward unpacks it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ppsim.executor.builders import discard
from ppsim.executor.builders.common import Piece
from ppsim.executor.builders.hybrid import HybridLayer, LinearAttentionLayer
from ppsim.executor.builders.stage import AttentionCore, checkpointed
from ppsim.policy.model import StagePolicy

DISCARDING = ("layernorm", "moe_act", "mla_up_proj")
"""Recompute modules that free their output (discard.py), not only their internals."""

offloaded: list[int] = [0]
"""Bytes moved to the host since the last reset (the tests read it)."""


def _roles(layer: nn.Module) -> dict[str, list[nn.Module | Piece]]:
    """Role -> the layer's modules that play it (empty when the layer has none)."""
    get = functools.partial(getattr, layer)
    if hasattr(layer, "norm1"):  # the GPT block: both norms fused in Megatron's spec
        split = layer.columns is not None  # tensor-parallel: one piece each
        out = {"qkv_linear": [layer.columns] if split else [get("q"), get("kv")],
               "core_attn": [get("attention")],
               "attn_proj": [layer.rows] if split else [get("proj")], "mlp": [get("mlp")]}
    elif hasattr(layer, "attn_norm"):  # the Llama layer
        att = get("attention")
        mlp = get("mlp")
        moe = hasattr(mlp, "router")
        proj = att.output_linear() if hasattr(att, "output_linear") else att.o
        out = {"qkv_linear": att.input_linears(), "core_attn": [att.core], "attn_proj": [proj],
               "mla_up_proj": [att.up] if hasattr(att, "up") else [],
               "mlp": [] if moe else [mlp], "moe": [mlp] if moe else [],
               "expert_fc1": [mlp.fc1] if moe else [], "moe_act": [mlp.act] if moe else [],
               "shared_experts": [mlp.shared] if moe and mlp.shared is not None else []}
        out |= _norms(get("attn_norm") if hasattr(att, "up") else None,
                      get("mlp_norm") if moe else None)
    elif isinstance(layer, HybridLayer):  # one half of the Llama layer's
        out = _hybrid_roles(layer.norm, layer.mixer)
    elif isinstance(layer, LinearAttentionLayer):  # a GatedDeltaNet layer: its two halves'
        out = {}
        for half in layer.halves():
            for role, modules in _hybrid_roles(half.norm, half.mixer).items():
                out[role] = [*out.get(role, []), *modules]
    else:
        out = {"core_attn": [m for m in layer.modules() if isinstance(m, AttentionCore)]}
    return out


def _hybrid_roles(norm: nn.Module, mixer: nn.Module) -> dict[str, list[nn.Module | Piece]]:
    """A hybrid layer's modules by role: an attention layer's are the attention half's,
    an MLP or MoE layer's the MLP half's (its norm the mlp_norm); Mamba and GatedDeltaNet
    layers have none (ppsim.costs.saved.HYBRID_HALVES)."""
    if hasattr(mixer, "core"):
        return {"qkv_linear": mixer.input_linears(), "core_attn": [mixer.core],
                "attn_proj": [mixer.o], **_norms(norm if hasattr(mixer, "up") else None, None)}
    if hasattr(mixer, "router"):
        return {"moe": [mixer], "expert_fc1": [mixer.fc1], "moe_act": [mixer.act],
                "shared_experts": [mixer.shared] if mixer.shared is not None else [],
                **_norms(None, norm)}
    if hasattr(mixer, "up"):
        return {"mlp": [mixer]}
    return {}


def _norms(attn_norm: nn.Module | None, mlp_norm: nn.Module | None
           ) -> dict[str, list[nn.Module | Piece]]:
    """The norm roles of a layer whose separate norms are these (None: fused into the next
    linear in Megatron's spec, so no `layernorm` recompute or norm offload acts on it:
    ppsim.costs.modules.separate_norms): an MLA layer's input norm, a MoE layer's
    pre-MLP norm."""
    both = [m for m in (attn_norm, mlp_norm) if m is not None]
    return {"attn_norm": [attn_norm] if attn_norm is not None else [],
            "mlp_norm": [mlp_norm] if mlp_norm is not None else [], "layernorm": both}


def _wrap(module: nn.Module | Piece, around: Callable[..., Any]) -> None:
    """Run module's forward through `around(forward, *args)`."""
    inner = module.forward
    module.forward = functools.partial(around, inner)


def _fresh(cache: dict, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A layer's forward with its own offload cache (one microbatch's, emptied after)."""
    cache.clear()
    try:
        return forward(*args, **kwargs)
    finally:
        cache.clear()


def _offload_forward(module: nn.Module, cache: dict, forward: Callable[..., Any], *args: Any,
                     **kwargs: Any) -> Any:
    # Weights and buffers (rotary tables) stay: only activations go to the host.
    static = {t.untyped_storage().data_ptr() for t in [*module.parameters(),
                                                        *module.buffers()]}

    def pack(t: torch.Tensor) -> Any:
        if t.untyped_storage().data_ptr() in static or discard.pending(t):
            return t  # a weight, or an output a recompute module frees anyway
        # One host copy per storage a layer's modules save (q, k and v share an input;
        # attention's output and the projection's input are one storage in two layouts).
        # The cache holds the device tensor until the layer's forward ends (as Megatron
        # frees an offload group when it commits), so no new tensor takes its address.
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.dtype)
        if key not in cache:
            flat = t.new_empty(0).set_(storage, 0, (storage.nbytes() // t.element_size(),))
            host = torch.empty(flat.shape, dtype=t.dtype, device="cpu",
                               pin_memory=t.device.type == "cuda")
            host.copy_(flat, non_blocking=t.device.type == "cuda")
            offloaded[0] += host.nbytes
            cache[key] = (t, host)
        return t.device, cache[key][1], tuple(t.shape), t.stride(), t.storage_offset()

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host, shape, stride, offset = packed
        return host.to(device, non_blocking=device.type == "cuda").as_strided(
            shape, stride, offset)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return forward(*args, **kwargs)


def unsupported(layer: nn.Module, p: StagePolicy) -> tuple[str, ...]:
    """The policy's modules a layer has no piece for: none in the shipped builders'
    layers, hybrid ones included (a module a layer lacks, such as moe in a dense one or
    any in a Mamba one, is one the model prices at nothing there too); in any other
    layer all but core_attn, which is found by its AttentionCore."""
    if hasattr(layer, "norm1") or hasattr(layer, "attn_norm") \
            or isinstance(layer, (HybridLayer, LinearAttentionLayer)):
        return ()
    named = dict.fromkeys((*p.recompute_modules, *p.offload_modules))
    found = _roles(layer)
    return tuple(m for m in named if not found.get(m))


def apply_policy(layers: nn.ModuleDict, p: StagePolicy) -> None:
    """Checkpoint and offload the stage's layers (in order) as the policy says; the
    first N layers whole, the first offload_fraction of the others' offload modules.
    ValueError for a module a layer has no piece for (`unsupported`)."""
    ordered = list(layers.values())
    n = min(p.recompute_layers, len(ordered))
    rest = ordered[n:]
    for layer in rest:
        if missing := unsupported(layer, p):
            raise ValueError(f"{type(layer).__name__} layers have no piece for "
                             f"{', '.join(missing)}")
    off_layers = round(p.offload_fraction * len(rest)) if p.offload_modules else 0
    for i, layer in enumerate(ordered):
        if i < n:
            _wrap(layer, checkpointed)
            continue
        roles = _roles(layer)
        # "moe" checkpoints the whole MoE, which recomputes its activation anyway.
        subsumed = {"moe_act"} if "moe" in p.recompute_modules else set()
        discarded = False
        for name in set(p.recompute_modules) - subsumed:
            for m in roles.get(name, []):
                _wrap(m, discard.discarding if name in DISCARDING else checkpointed)
                discarded |= name in DISCARDING
        if discarded:
            _wrap(layer, discard.layer_scope)
        if i - n < off_layers:
            cache: dict = {}
            _wrap(layer, functools.partial(_fresh, cache))
            for name in p.offload_modules:
                for m in roles.get(name, []):
                    _wrap(m, functools.partial(_offload_forward, m, cache))
