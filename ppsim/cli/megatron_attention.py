"""Megatron's attention arguments as [model] fields: the backend (--attention-backend,
whose unfused core ppsim prices apart), the layer spec (--transformer-impl), a sliding
window, query and key norms, the output gate, the experimental variants
(--experimental-attention-variant gdn|dsa), and context parallelism's traffic
(--cp-comm-type, --hierarchical-context-parallel-sizes); ppsim.cli.megatron_model reads
the rest."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from ppsim.costs.choices import ATTENTION_VARIANTS, CP_COMM_TYPES, LINEAR_VARIANTS
from ppsim.errors import UserError

ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
"""Megatron's AttnBackend (megatron/core/transformer/enums.py)."""
TRANSFORMER_IMPLS = ("transformer_engine", "local", "inference_optimized")
"""Megatron's --transformer-impl; ppsim prices Transformer Engine's layer spec (its default)."""
UNFUSED_BACKENDS = ("unfused", "local")
"""The backends that compute the whole score matrix (`unfused_attention`), as Model
Optimizer's --export-force-local-attention does too."""
GDP_SPECS = ("gdp_stack_spec", "gated_delta_product_stack_spec")
"""The hybrid stack specs that build Gated DeltaProduct mixers where the pattern has 'M'
(megatron/core/models/hybrid/hybrid_layer_specs.py)."""
HIERARCHICAL = "--hierarchical-context-parallel-sizes"
FORCE_LOCAL = "megatron_run_export_force_local_attention"
"""Where argparse keeps --export-force-local-attention (ppsim.cli.megatron_run)."""


def attention_fields(args: argparse.Namespace, known: dict[str, Any]) -> dict[str, Any]:
    """The [model] fields the attention's flags set over the model's `known` ones: the
    unfused core, a sliding window, query and key norms, the output gate, an experimental
    variant."""
    get = lambda dest: getattr(args, dest, None)  # noqa: E731
    out = _window_fields(get("window_size"), get("window_attn_skip_freq"))
    out.update(_attention_variant_fields(get, known.get("experimental_attention_variant")))
    # Under MLA --qk-layernorm builds the latents' norms; --qk-l2-norm's L2Norm (Llama 4)
    # makes the same passes and keeps the same tensors as the query and key norms.
    mla = get("multi_latent_attention") or known.get("attention") == "mla"
    if get("qk_l2_norm") and mla:
        raise UserError("--qk-l2-norm", "qk_l2_norm is not supported with MLA. (Megatron's "
                        "words)", "use --qk-layernorm, the latents' norms")
    if get("qk_layernorm") or get("qk_l2_norm"):
        out["qk_layernorm"] = True
    if get("attention_output_gate"):
        out["attention_output_gate"] = True
    unfused = unfused_backend(args)
    if unfused is not None:
        out["unfused_attention"] = unfused
    return out


def unfused_backend(args: argparse.Namespace) -> bool | None:
    """Whether the attention backend flags ask for the unfused core; None: not given."""
    if getattr(args, FORCE_LOCAL, None) is not None:
        return True
    backend = getattr(args, "attention_backend", None)
    return None if backend is None else backend in UNFUSED_BACKENDS


def _spec_name(spec: str) -> str:
    """The function a --spec names, read as Megatron's training.py reads it
    (_uses_gated_delta_product_spec: the last word, brackets and commas as spaces)."""
    words = spec.replace("[", " ").replace("]", " ").replace(",", " ").split()
    return words[-1] if words else ""


def check_spec(args: argparse.Namespace) -> None:
    """The layer spec ppsim prices is Transformer Engine's (fused norms and attention):
    Megatron's local spec (separate norms, DotProductAttention) and the inference one are
    refused, and so is the hybrid stack's Gated DeltaProduct spec; attention sinks
    (--softmax-type learnable or off-by-one), which no FlashAttention kernel takes, are
    said to be priced at its rate."""
    get = lambda dest: getattr(args, dest, None)  # noqa: E731
    spec = " ".join(get("spec") or ())
    if _spec_name(spec) in GDP_SPECS:
        raise UserError(f"--spec {spec}", "builds Gated DeltaProduct mixers in place of "
                        "the pattern's Mamba-2 layers (Megatron counts their FLOPs apart), "
                        "which ppsim does not price",
                        "drop it, or give hybrid_stack_spec, to price Mamba-2 layers")
    impl = get("transformer_impl")
    if impl not in (None, "transformer_engine"):
        raise UserError(f"--transformer-impl {impl}", "ppsim prices Transformer Engine's "
                        "layer spec (norms fused into the linears, a fused attention); "
                        "Megatron's local or inference spec builds other modules",
                        "drop it; --attention-backend unfused prices the local spec's "
                        "attention")
    if get("softmax_type") in ("learnable", "off-by-one") and not unfused_backend(args):
        print(f"note: --softmax-type {get('softmax_type')} (attention sinks) priced at "
              "FlashAttention's rate, which runs no sinks: Transformer Engine takes cuDNN's "
              "fused kernel or its unfused path (--attention-backend unfused prices that)",
              file=sys.stderr)


def _attention_variant_fields(get: Any, base: str | None) -> dict[str, Any]:
    """--experimental-attention-variant (with --linear-attention-freq under gdn, given or
    the `base` model's) as fields (the config checks them:
    ppsim.config.features.attention_variant); a variant ppsim does not price refused by
    name; the frequency without a linear variant Megatron ignores, and so does ppsim (with
    a warning)."""
    variant, freq = get("experimental_attention_variant"), get("linear_attention_freq")
    linear = variant if variant is not None else base
    if variant is not None and variant not in ATTENTION_VARIANTS:
        raise UserError("--experimental-attention-variant", f"{variant!r} is not priced: "
                        "ppsim prices gdn (gated_delta_net) and dsa", "give one of those")
    if freq is not None and linear not in LINEAR_VARIANTS:
        print(f"warning: --linear-attention-freq {freq} ignored without a linear "
              "--experimental-attention-variant, as Megatron ignores it", file=sys.stderr)
        freq = None
    out = {"experimental_attention_variant": variant, "linear_attention_freq": freq}
    return {k: v for k, v in out.items() if v is not None}


def _window_fields(size: str | None, freq: str | None) -> dict[str, Any]:
    """Megatron's --window-size "W,R" (keys before and after each query; -1: all) and
    --window-attn-skip-freq as [model] fields: ppsim prices causal windows, R = 0."""
    out: dict[str, Any] = {} if freq is None else {"window_attn_skip_freq": freq}
    if size is None:
        return out
    try:
        left, right = (int(x) for x in size.replace("(", "").replace(")", "").split(","))
    except ValueError:
        raise UserError("--window-size", f"{size!r} is not two whole numbers",
                        "write e.g. 127,0") from None
    if right != 0 and (left, right) != (-1, -1):
        raise UserError("--window-size", f"{size}: keys after a query are not causal "
                        "attention, which ppsim prices", "give W,0")
    out["attention_window"] = max(left, 0)  # -1: no limit
    return out


def context_parallel_fields(get: Any, known: dict[str, Any]) -> dict[str, Any]:
    """The [model] fields of Megatron's --cp-comm-type and
    --hierarchical-context-parallel-sizes (`get`: a flag's value by its dest; `known`: the
    model's fields already). Megatron forms the hierarchical groups for any type, and
    only a2a+p2p uses them: beside another they are checked and left unpriced."""
    out: dict[str, Any] = {}
    if get("cp_comm_type") is not None:
        out["cp_comm_type"] = _cp_comm_type(get("cp_comm_type"))
    sizes = get("hierarchical_context_parallel_sizes")
    if sizes is None:
        return out
    if out.get("cp_comm_type", known.get("cp_comm_type", "p2p")) == "a2a+p2p":
        out["cp_a2a_size"] = _a2a_size(sizes, get("cp"))
    else:
        _sizes_make_cp(sizes, get("cp"))
    return out


def _cp_comm_type(kinds: list[str]) -> str:
    """Megatron's --cp-comm-type, one type for every layer or one a layer: ppsim prices one
    for all (CP_COMM_TYPES)."""
    if len(set(kinds)) > 1:
        raise UserError("--cp-comm-type", f"{' '.join(kinds)}: ppsim prices one type for "
                        "every layer", "give one of " + ", ".join(CP_COMM_TYPES))
    if kinds[0] not in CP_COMM_TYPES:
        raise UserError("--cp-comm-type", f"{kinds[0]}: ppsim prices "
                        + ", ".join(CP_COMM_TYPES), "give one of them")
    return kinds[0]


def _a2a_size(sizes: list[int], cp: int | None) -> int:
    """The all-to-all size of Megatron's --hierarchical-context-parallel-sizes, which
    a2a+p2p reads as two levels: its all-to-all's and its ring's, multiplying to cp."""
    if len(sizes) != 2:
        raise UserError(HIERARCHICAL, f"{' '.join(map(str, sizes))}: a2a+p2p takes two "
                        "sizes, its all-to-all's and its ring's", "give two, e.g. 2 4 for cp 8")
    _sizes_make_cp(sizes, cp)
    return sizes[0]


def _sizes_make_cp(sizes: list[int], cp: int | None) -> None:
    """Megatron's assertion on the hierarchical sizes: they multiply to cp."""
    if min(sizes) < 1:
        raise UserError(HIERARCHICAL, f"{' '.join(map(str, sizes))}: a group size is at least "
                        "1", "give sizes that multiply to cp, e.g. 2 4 for cp 8")
    if cp is not None and math.prod(sizes) != cp:
        raise UserError(HIERARCHICAL, f"{' x '.join(map(str, sizes))} is not "
                        f"--context-parallel-size ({cp}), as Megatron asserts",
                        "give sizes that multiply to cp")
