"""One validator for every number a user can hand us: flags, TOML, cost files, traces.

The CLI, config loading, cost files, traces and the TUI all call these, so a
NaN, an infinity, a 1e308 or a count out of range is refused the same way
everywhere: a `UserError` naming the field, the limit and the fix, before any
work is done with it (files are read by ppsim.config.files). Pure: no I/O, no torch.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from ppsim.config import features, limits, parallel_rules, state_rules
from ppsim.costs.arch import DTYPE_BYTES
from ppsim.costs.choices import (
    ATTENTION,
    ATTENTION_VARIANTS,
    CP_COMM_TYPES,
    FP8_FORMATS,
    FSDP_FRAMEWORKS,
    FSDP_RESHARD,
    GATED_ACTIVATIONS,
    MUON_TP_MODES,
    NORMS,
    OPTIMIZERS,
    POSITIONS,
    RECOMPUTE,
)
from ppsim.costs.model import INTEGER_FIELDS
from ppsim.costs.op_sac import OP_SAC, op_sac_refusal
from ppsim.costs.state import OPTIMIZER_DTYPES
from ppsim.errors import UserError

MAX_MS = 1e9
"""Any one duration or latency (11.6 days): far above real, far below overflow."""
MAX_BYTES = 1e18
"""Any byte count (an exabyte)."""
MIN_GBPS = 1e-3
"""A bandwidth other than 0 (free) below 1 MB/s is a typo for one in other units."""
MAX_GBPS = 1e5
"""100 TB/s: above any link or memory (HBM3e is ~5 TB/s, NVLink 5 1.8 TB/s)."""
MIN_TFLOPS = 1e-3
"""1 GFLOP/s: below one CPU core."""
MAX_TFLOPS = 1e5
"""100 PFLOP/s a device: far above any accelerator (B200 is ~2.3 PFLOP/s dense bf16)."""
MAX_SECONDS = 1e7
"""Time budgets and timeouts (116 days)."""
MAX_INDEX = 10**9
"""Iteration and microbatch numbers in a trace."""


def shown(value: Any) -> str:
    """repr, cut short: a 5,000-digit count or a long string stays one readable line."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(where: str, value: Any, *, lo: float = 0.0, hi: float, lo_open: bool = False,
           fix: str = "") -> float:
    """A finite float in [lo, hi] ((lo, hi] when lo_open); UserError otherwise."""
    if not _is_number(value):
        raise UserError(where, f"expected a number, got {shown(value)}",
                        fix or "write a number")
    try:
        x = float(value)
    except OverflowError:  # an int too large for a float
        x = math.inf
    if math.isnan(x) or math.isinf(x):
        raise UserError(where, f"must be a finite number, got {shown(value)}",
                        fix or f"write a number between {lo:g} and {hi:g}")
    if x < lo or (lo_open and x == lo) or x > hi:
        bound = f"above {lo:g}" if lo_open else f"at least {lo:g}"
        raise UserError(where, f"must be {bound} and at most {hi:g}, got {shown(value)}",
                        fix or f"write a number between {lo:g} and {hi:g}")
    return x


def count(where: str, value: Any, *, lo: int = 1, hi: int, fix: str = "") -> int:
    """An integer in [lo, hi] (an integral float is accepted); UserError otherwise."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(where, f"expected an integer, got {shown(value)}",
                        fix or "write an integer")
    if not lo <= value <= hi:
        given = f"{value:,}" if abs(value) < 10**30 else "a number of over 30 digits"
        raise UserError(where, f"must be between {lo:,} and {hi:,}, got {given}",
                        fix or f"use {lo:,} to {hi:,}")
    return value


def duration_ms(where: str, value: Any) -> float:
    return number(where, value, hi=MAX_MS, fix="write a duration in ms >= 0")


def byte_count(where: str, value: Any) -> int:
    x = number(where, value, hi=MAX_BYTES, fix="write a byte count >= 0")
    if not x.is_integer():
        raise UserError(where, f"is a byte count, got {value!r}", "write a whole number")
    return int(x)


def seconds(where: str, value: Any) -> float:
    """A positive, finite time budget or timeout in seconds."""
    return number(where, value, lo=0.0, lo_open=True, hi=MAX_SECONDS,
                  fix=f"give seconds above 0, at most {MAX_SECONDS:g}")


# ------------------------------------------------------------------ config sections


def suggest(name: str, choices: list[str] | tuple[str, ...]) -> str:
    """The fix for an unknown key: the closest valid one, or the list."""
    unique = list(dict.fromkeys(choices))  # callers join field lists that may overlap
    close = difflib.get_close_matches(name, unique, n=1)
    return f"did you mean {close[0]!r}?" if close else "valid keys: " + ", ".join(unique)


def table(where: str, value: Any) -> dict[str, Any]:
    """A TOML table (a section or a sub-table); UserError for a scalar or a list."""
    if not isinstance(value, dict):
        raise UserError(where, f"must be a table, got {type(value).__name__} {shown(value)}",
                        f"write it as a [{where}] section")
    return value


def preset_name(where: str, value: Any) -> Any:
    """A preset's name; the example fits the table (`hardware.preset`: a hardware one)."""
    if value is not None and not isinstance(value, str):
        example = "h100-80gb" if where.startswith("hardware") else "tiny-gpt"
        raise UserError(where, f"must be a preset name (a string), got {shown(value)}",
                        f"write e.g. preset = \"{example}\" (see ppsim presets)")
    return value


def bandwidth(where: str, value: Any, zero_means: str) -> float:
    """GB/s: 0 (what `zero_means`) or between MIN_GBPS and MAX_GBPS, both named."""
    fix = f"give GB/s from {MIN_GBPS:g} to {MAX_GBPS:g}, or 0 {zero_means}"
    x = number(where, value, hi=MAX_GBPS, fix=fix)
    if 0 < x < MIN_GBPS:
        raise UserError(where, f"{shown(value)} GB/s is below the floor of {MIN_GBPS:g} "
                        "(1 MB/s)", fix)
    return x


def placement(p: Any) -> None:
    """Ranges of a [placement] table (ppsim.placement checks devices against pp)."""
    for name in ("intra_node_latency_ms", "inter_node_latency_ms", "context_switch_ms",
                 "message_cpu_ms", "local_message_cpu_ms"):
        if getattr(p, name, None) is not None:
            number(f"placement.{name}", getattr(p, name), hi=MAX_MS, fix="give ms >= 0")
    for name in ("intra_node_bandwidth_gbps", "inter_node_bandwidth_gbps"):
        if getattr(p, name, None) is not None:
            bandwidth(f"placement.{name}", getattr(p, name), "for free transfers")
    if isinstance(getattr(p, "ranks_per_node", None), int):
        count("placement.ranks_per_node", p.ranks_per_node, lo=0, hi=limits.MAX_STAGES)
    devices = getattr(p, "devices", None)
    if isinstance(devices, list) and len(devices) > limits.MAX_STAGES:
        raise UserError("placement.devices", f"has {len(devices):,} entries, above the limit "
                        f"of {limits.MAX_STAGES:,}", "give one device index per rank")


def stages(p: Any) -> None:
    """pp and vpp of a PipelineConfig whole numbers >= 1: checked before a split is made
    from them (the upper limits are ppsim.limits')."""
    for name in ("pp", "vpp"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"pipeline.{name}", f"must be a positive integer, got {shown(v)}",
                            "set it to 1 or more")


DISPATCHERS = ("alltoall", "flex", "allgather")
"""Megatron's token dispatchers (flex: DeepEP, ppsim.job.collectives.deepep_ms)."""


def pipeline(p: Any) -> None:
    """Split counts of a PipelineConfig in range. pp, vpp and microbatches are refused by
    ppsim.limits.check_request when a command is asked for (a config may hold any)."""
    for name in ("first_stage_layers", "last_stage_layers"):
        v = getattr(p, name)
        if v is not None:
            count(f"pipeline.{name}", v, lo=0, hi=limits.MAX_LAYERS)
    if p.moe_token_dispatcher_type not in DISPATCHERS:
        raise UserError("pipeline.moe_token_dispatcher_type",
                        f"unknown dispatcher {shown(p.moe_token_dispatcher_type)}",
                        "choose one of " + ", ".join(DISPATCHERS))
    if getattr(p, "moe_flex_dispatcher_num_sms", None) is not None:
        count("pipeline.moe_flex_dispatcher_num_sms", p.moe_flex_dispatcher_num_sms, lo=1,
              hi=1024, fix="give the SMs DeepEP's kernels take, e.g. 20 (Megatron's default)")
    if isinstance(p.split, list):  # or "even"
        if len(p.split) > limits.MAX_STAGES:
            raise UserError("pipeline.split", f"has {len(p.split):,} entries, above the limit "
                            f"of {limits.MAX_STAGES:,}", "give one count per virtual stage")
        for i, c in enumerate(p.split):
            count(f"pipeline.split[{i}]", c, lo=0, hi=limits.MAX_LAYERS,
                  fix="write layer counts, e.g. split = [6, 2]")


def layer_table(where: str, raw: dict[str, Any]) -> None:
    """Numbers of a uniform layer (or embedding/head table): finite, >= 0, in range."""
    for key, value in raw.items():
        if key in INTEGER_FIELDS:
            byte_count(f"{where}.{key}", value)
        else:
            duration_ms(f"{where}.{key}", value)


_WRITE_A = {int: "write a whole number", float: "write a number", str: "write a string",
             bool: "write true or false", list: "write a list [..]", dict: "write a table"}
"""The fix a mistyped field's message names, in words."""


def typed(where: str, value: Any, kind: type) -> Any:
    """value if it is a `kind` (an int counts as a float, a bool as neither); floats
    finite (their ranges are checked per field)."""
    ok = (kind is float and _is_number(value)) \
        or (kind is int and isinstance(value, int) and not isinstance(value, bool)) \
        or (kind is not float and kind is not int and isinstance(value, kind))
    if not ok:
        raise UserError(where, f"expected {kind.__name__}, got {value!r}"[:200],
                        _WRITE_A.get(kind, f"write a {kind.__name__}"))
    if kind is float:
        return number(where, value, lo=-math.inf, hi=math.inf, fix="write a finite number")
    return value


ARCH_MAX = 10**7
"""Any architecture dimension or count: far above real models, and small enough that
FLOPs stay exact floats (a 200-digit hidden_size would overflow float conversion)."""
_CHOICES = {"recompute": RECOMPUTE, "dtype": tuple(DTYPE_BYTES), "attention": ATTENTION,
            "norm": NORMS, "position": POSITIONS, "fsdp_reshard_after_forward": FSDP_RESHARD,
            "fsdp_framework": FSDP_FRAMEWORKS,
            "fp8": FP8_FORMATS, "cp_comm_type": CP_COMM_TYPES,
            "gated_activation": GATED_ACTIVATIONS, "optimizer": OPTIMIZERS,
            "muon_tp_mode": MUON_TP_MODES, "experimental_attention_variant": ATTENTION_VARIANTS,
            **OPTIMIZER_DTYPES}
_POSITIVE = ("tp", "dp", "ep", "cp", "dp_replicas", "vocab_divisor", "hidden_size",
             "muon_ns_steps", "optimizer_cpu_threads", "num_heads", "num_kv_heads",
             "ffn_hidden_size", "vocab_size", "seq_length", "micro_batch_size",
             "dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk")
_COUNTS = ("attention_window", "moe_latent_size", "mtp_layers", "head_dim", "q_lora_rank",
           "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "cp_a2a_size", "num_experts", "etp",
           "top_k", "moe_ffn_hidden_size", "shared_experts", "num_layers_at_start_in_bf16",
           "num_layers_at_end_in_bf16", "shared_expert_ffn_hidden_size", "loss_chunks",
           "max_position_embeddings")
_REQUIRED = ("hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
             "seq_length")


_SWITCHES = ("gated_mlp", "distributed_optimizer", "dropout", "tie_embeddings", "pad_vocab",
             "grad_reduce_in_bf16", "grads_in_fp32", "precision_aware_optimizer", "fsdp",
             "moe_pad_to_capacity", "fp8_param_gather", "first_last_layers_bf16",
             "bias_swiglu_fusion", "gradient_accumulation_fusion", "unfused_attention",
             "qk_layernorm", "sequence_parallel", "fp32_residual", "linear_bias",
             "attention_output_gate", "shared_expert_gate", "moe_permute_fusion",
             "optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "fsdp_cpu_offload")
"""The transformer's boolean fields."""


def _refused_pairs(raw: dict[str, Any]) -> None:
    """Fields each valid alone that Megatron (or torchtitan) refuses together."""
    if raw.get("moe_pad_to_capacity") is True and not raw.get("moe_capacity_factor"):
        # Megatron's TransformerConfig raises this; ppsim would price the pad as dropless
        raise UserError("model.moe_pad_to_capacity", "moe_expert_capacity_factor must be "
                        "set to use moe_pad_expert_input_to_capacity (Megatron's words)",
                        "add --moe-expert-capacity-factor F (moe_capacity_factor), or drop "
                        "--moe-pad-expert-input-to-capacity")
    if raw.get("fp32_residual") is True and raw.get("dtype", "bf16") == "fp32":
        raise UserError("model.fp32_residual", "residual connection in fp32 only supported "
                        "when using fp16 or bf16 (Megatron's assertion)",
                        "train in bf16 or fp16 with --bf16 or --fp16, or drop "
                        "--fp32-residual-connection")
    if raw.get("recompute") == OP_SAC and op_sac_refusal(raw):
        raise UserError("model.recompute", f"{OP_SAC} (torchtitan's SelectiveAC): "
                        + op_sac_refusal(raw), "use recompute full or none (torchtitan's "
                        "activation-checkpoint:full or :none)")


def transformer(raw: dict[str, Any]) -> None:
    """Types and ranges of a transformer's merged fields (shapes are checked with the
    costs): choices known, counts whole and bounded, the required widths present."""
    for key, choices in _CHOICES.items():
        if key in raw and raw[key] not in choices:
            raise UserError(f"model.{key}", f"unknown value {raw[key]!r}",
                            "use " + " | ".join(c or '""' for c in choices))
    for key, low in [(k, 1) for k in _POSITIVE] + [(k, 0) for k in _COUNTS]:
        if key in raw and typed(f"model.{key}", raw[key], int) < low:
            raise UserError(f"model.{key}", f"must be at least {low}, got {raw[key]}",
                            "use a whole number >= " + str(low))
    for key in _SWITCHES:
        if key in raw:
            typed(f"model.{key}", raw[key], bool)
    for key in ("layers", "window_attn_skip_freq", "linear_attention_freq"):
        if key in raw:
            typed(f"model.{key}", raw[key], str)
    if "optimizer_offload_fraction" in raw:
        number("model.optimizer_offload_fraction", raw["optimizer_offload_fraction"], hi=1.0,
               fix="give the share of the optimizer's state on the host, 0 to 1")
    if "moe_capacity_factor" in raw:
        number("model.moe_capacity_factor", raw["moe_capacity_factor"], hi=1e3,
               fix="give the capacity over an expert's even share, e.g. 1.0, or 0 for "
               "dropless")
    _refused_pairs(raw)
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise UserError(f"model.{missing[0]}", "missing for a transformer model",
                        f"set {missing[0]} = N, or use preset = NAME")
    for key, value in raw.items():
        if key != "num_layers" and isinstance(value, int) and not isinstance(value, bool):
            count(f"model.{key}", value, lo=1 if key in _POSITIVE else 0, hi=ARCH_MAX,
                  fix="use a smaller number" if value > ARCH_MAX else "")
    if isinstance(raw.get("num_layers"), int) and isinstance(raw.get("mtp_layers"), int):
        limits.check_shape(raw["num_layers"], 1, 1, 1, raw["mtp_layers"])
    if raw.get("attention_output_gate") is True and raw.get("attention") == "mla":
        raise UserError("model.attention_output_gate", "Output gate is not supported for "
                        "MLA yet. (Megatron's error)", "drop attention_output_gate "
                        "(--attention-output-gate) or use attention = \"gqa\"")
    parallel_rules.parallel_shape(raw)
    state_rules.check(raw)
    features.sliding_window(raw)
    features.attention_variant(raw)
    features.fp8(raw)
