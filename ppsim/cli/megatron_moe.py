"""Megatron's flags for what a stack's layers hold: the routed and shared experts, where
the MoE layers go (--moe-layer-freq), and DeepSeek sparse attention's indexer sizes."""

from __future__ import annotations

import argparse
from dataclasses import fields
from itertools import groupby
from typing import Any

from ppsim.config.validate import ARCH_MAX
from ppsim.costs.arch import Architecture
from ppsim.costs.patterns import moe_layers
from ppsim.errors import UserError

DSA_SIZES = (("dsa_indexer_n_heads", "--dsa-indexer-n-heads"),
             ("dsa_indexer_head_dim", "--dsa-indexer-head-dim"),
             ("dsa_indexer_topk", "--dsa-indexer-topk"))
"""The DSA indexer's sizes (ppsim's defaults, Architecture's, are DeepSeek-V3.2's)."""


def check_dsa_sizes(flags: dict[str, Any], named: dict[str, Any],
                     attention: str | None) -> None:
    """Refused where Megatron's flags (`flags`: the fields they set) ask for DeepSeek
    sparse attention and neither they nor the model under them (`named`: the fields
    either names) give an indexer size: TransformerConfig leaves them None and dsa.py
    builds the indexer from them, so Megatron fails where ppsim would price its default.
    `attention`: the model's ("mla": DSA's own assertion comes first, ppsim.config)."""
    variant = flags.get("experimental_attention_variant") == "dsa"
    if not (variant and attention == "mla" or "D" in str(flags.get("hybrid_layer_pattern")
                                                             or "")):
        return
    v32 = {f.name: f.default for f in fields(Architecture)}
    for key, flag in DSA_SIZES:
        if named.get(key) is None:
            raise UserError(flag, "Megatron's DSA indexer has no default for it "
                            "(TransformerConfig leaves it None)",
                            f"add {flag} N (DeepSeek-V3.2: {v32[key]})")


def moe_fields(args: argparse.Namespace, fields: dict[str, Any]) -> dict[str, Any]:
    """The [model] fields the MoE flags give (capacity, padding, the shared experts'
    width, the MoE layers' places), over `fields`, the model's so far."""
    out: dict[str, Any] = {}
    factor = getattr(args, "moe_expert_capacity_factor", None)
    if factor == 0:
        raise UserError("--moe-expert-capacity-factor", "0 gives every expert a capacity of "
                        "no tokens, so Megatron's router drops them all (get_capacity)",
                        "give a positive factor, or a negative one for dropless")
    if factor is not None:  # Megatron takes a negative factor as dropless (NaN: refused later)
        out["moe_capacity_factor"] = 0.0 if factor < 0 else factor
    if getattr(args, "moe_pad_expert_input_to_capacity", None):
        out["moe_pad_to_capacity"] = True
    shared = getattr(args, "moe_shared_expert_intermediate_size", None)
    if shared is not None:
        width = fields.get("moe_ffn_hidden_size") or fields.get("ffn_hidden_size")
        if not width:
            raise UserError("--moe-shared-expert-intermediate-size", "needs the experts' "
                            "width", "add --moe-ffn-hidden-size N")
        # A whole number of experts keeps the short form a preset gives; any other
        # width is the MLP's own (Megatron builds one MLP of it either way), and so is
        # one the model refuses, so that its refusal names the width the line gave.
        whole = 0 < shared <= ARCH_MAX and shared % width == 0
        out["shared_experts"] = shared // width if whole else 0
        out["shared_expert_ffn_hidden_size"] = 0 if whole else shared
    freq = getattr(args, "moe_layer_freq", None)
    if freq is not None:
        if "num_layers" not in fields:
            raise UserError("--moe-layer-freq", "needs the layer count", "add --num-layers N")
        if not fields.get("num_experts"):
            raise UserError("--moe-layer-freq", "places MoE layers, but the model has no "
                            "routed experts", "add --num-experts N")
        out["layers"] = layer_kinds_spec(moe_layers(freq, fields["num_layers"]))
    return out


def bit_runs(pattern: list[int]) -> list[tuple[int, int]]:
    """(bit, how many in a row) of a 0/1 pattern."""
    return [(bit, len(list(group))) for bit, group in groupby(pattern)]


def layer_kinds_spec(pattern: list[int]) -> str:
    """A 0/1 pattern as ppsim's `layers` spec, runs of a kind together: "dense*3, moe*58"."""
    return ", ".join(f"{'moe' if bit else 'dense'}*{n}" for bit, n in bit_runs(pattern))
