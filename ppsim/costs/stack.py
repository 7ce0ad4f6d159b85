"""Which kind each decoder layer is (`layers`, the attention variant's layers, a hybrid
pattern's symbols) and its attention window."""

from __future__ import annotations

from ppsim.costs.arch import Architecture
from ppsim.costs.choices import LINEAR_VARIANTS
from ppsim.costs.hybrid import parse_pattern
from ppsim.costs.patterns import linear_attention_layers, windows
from ppsim.errors import UserError

KINDS = ("dense", "moe")
PAIRED_KINDS = {f"{mixer}-{kind}": (mixer, half) for mixer in ("gdn", "dsa")
                for kind, half in (("dense", "mlp"), ("moe", "moe-mlp"))}
"""A GPT model's decoder layers whose attention is an experimental variant
(experimental_attention_variant): each one piece that runs a hybrid stack's GatedDeltaNet
or DeepSeek-sparse-attention layer and its MLP or MoE layer."""


def layer_kinds(a: Architecture) -> tuple[str, ...]:
    """The decoder layers' kinds, in order, from the `layers` spec, with the attention
    variant where it is (PAIRED_KINDS), or the hybrid pattern's symbols
    (ppsim.costs.hybrid)."""
    if a.hybrid_layer_pattern:
        return parse_pattern(a.hybrid_layer_pattern).kinds
    kinds = _stack_kinds(a)
    if a.experimental_attention_variant == "dsa":
        return tuple(f"dsa-{k}" for k in kinds)
    if a.experimental_attention_variant not in LINEAR_VARIANTS:
        return kinds
    linear = linear_attention_layers(a.linear_attention_freq, a.num_layers)
    return tuple(f"gdn-{k}" if bit else k for k, bit in zip(kinds, linear, strict=True))


def mlp_kind(kind: str) -> str:
    """A GPT model's decoder layer's MLP kind ("dense" or "moe"), its attention aside."""
    return kind.split("-", 1)[1] if kind in PAIRED_KINDS else kind


def _stack_kinds(a: Architecture) -> tuple[str, ...]:
    """The decoder layers' MLP kinds from the `layers` spec (all MoE with experts)."""
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
        raise UserError("model.num_experts", "MoE layers need routed experts", "set "
                        "num_experts (top_k and moe_ffn_hidden_size default to Megatron's 2 "
                        "and the dense width)")
    return tuple(out)


def layer_windows(a: Architecture) -> tuple[int, ...]:
    """Each decoder layer's attention window (0: full causal attention)."""
    return windows(a.num_layers, a.attention_window, a.window_attn_skip_freq)
