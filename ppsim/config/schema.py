"""The TOML config: [model], [pipeline], [hardware]; loading, flags, saving.

Every user mistake becomes a `UserError` naming the field and the fix.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from ppsim.config import validate
from ppsim.config.presets import HARDWARE_PRESETS, MODEL_PRESETS
from ppsim.costs.transformer import (
    ATTENTION,
    DTYPE_BYTES,
    NORMS,
    POSITIONS,
    RECOMPUTE,
    Architecture,
)
from ppsim.errors import UserError
from ppsim.pipeline.placement import PlacementConfig

LAYER_FIELDS = ("forward_ms", "backward_ms", "weight_grad_ms", "static_bytes",
                "activation_bytes", "weight_grad_bytes", "output_bytes", "params",
                "split_backward_ms")
ARCH_FIELDS = tuple(f.name for f in fields(Architecture))

DEFAULT_TOML = """\
# ppsim's embedded default: a tiny LLM on 2 CPU ranks, 1F1B, uneven split.
# Its vocabulary (8192) dwarfs its width (64), as an LLM's does, so on a CPU
# the LM head and loss weigh ~4 of its layers on the last rank.
[model]
preset = "tiny-llm"

[pipeline]
pp = 2
vpp = 1
microbatches = 8
schedule = "1f1b"
# What `ppsim demo` plans from this CPU's measured costs: 2 layers join the head.
split = [6, 2]

[hardware]
preset = "cpu"
"""


@dataclass(kw_only=True)
class PipelineConfig:
    pp: int = 2
    """Pipeline ranks."""
    vpp: int = 1
    """Model chunks (virtual stages) per rank."""
    microbatches: int = 8
    """Microbatches per iteration (gradient accumulation steps)."""
    schedule: str = "1f1b"
    """gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv, dualpipev."""
    split: list[int] | str | None = None
    """Layers per virtual stage, Megatron order (MTP layers count too); or "even":
    Megatron's default split, refused when the layers do not divide."""
    layout: str | None = None
    """Megatron --pipeline-model-parallel-layout."""
    first_stage_layers: int | None = None
    """Megatron --decoder-first-pipeline-num-layers."""
    last_stage_layers: int | None = None
    """Megatron --decoder-last-pipeline-num-layers."""
    account_for_embedding: bool = False
    account_for_loss: bool = False
    actions_csv: str | None = None
    """A torch.distributed.pipelining schedule CSV whose order replaces `schedule`'s."""


@dataclass(kw_only=True)
class HardwareConfig:
    preset: str | None = None
    memory_bytes: float = 80e9
    """Device memory one rank may use."""
    p2p_latency_ms: float = 0.0
    p2p_bandwidth_gbps: float = 0.0
    """GB/s (10^9 bytes per second); 0 means transfers are free."""
    peak_tflops: float = 989.0
    efficiency: float = 0.5
    """Matmul fraction of peak, used when matmul_efficiency is empty."""
    matmul_efficiency: list[list[float]] | None = None
    """[[GFLOP of one matmul, fraction of peak], ...]: the efficiency curve, interpolated
    in log GFLOP (ppsim profile --hardware-out measures it); none: `efficiency`."""
    attention_efficiency: float = 0.0
    """FlashAttention's achieved fraction of peak (causal); 0: as a matmul."""
    memory_bandwidth_gbps: float = 0.0
    """Achieved device-memory bandwidth in GB/s for norms, activations, the loss
    (a copy test's figure); 0: memory-bound ops cost nothing."""
    kernel_overhead_us: float = 0.0
    """Least time one kernel takes: host dispatch plus launch, in microseconds."""


@dataclass(kw_only=True)
class Config:
    model: dict[str, Any] = field(default_factory=dict)
    """The [model] table as written (preset, kind, fields, embedding/head tables)."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    costs_file: str | None = None
    """Measured costs (ppsim profile / calibrate) that replace the analytic model."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Which device each rank runs on and which links messages share ([placement])."""

    @property
    def num_layers(self) -> int:
        return int(model_fields(self.model)["num_layers"])


# ------------------------------------------------------------------ loading


def _suggest(name: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f"did you mean {close[0]!r}?" if close else "valid keys: " + ", ".join(choices)


def _check_type(where: str, value: Any, kind: type) -> Any:
    ok = (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool)) \
        or (kind is int and isinstance(value, int) and not isinstance(value, bool)) \
        or (kind is not float and kind is not int and isinstance(value, kind))
    if not ok:
        raise UserError(where, f"expected {kind.__name__}, got {value!r}"[:200],
                        f"write a {kind.__name__}")
    if kind is float:
        # Ranges are checked per field (validate.hardware); here only finiteness,
        # so no NaN or infinity gets past loading.
        return validate.number(where, value, lo=-float("inf"), hi=float("inf"),
                               fix="write a finite number")
    return value


def model_fields(model: dict[str, Any]) -> dict[str, Any]:
    """Merge a [model] table onto its preset; the dict that builds the costs."""
    raw = dict(model)
    preset = raw.pop("preset", None)
    if preset is not None:
        if preset not in MODEL_PRESETS:
            raise UserError("model.preset", f"unknown preset {preset!r}",
                            "choose one of " + ", ".join(MODEL_PRESETS))
        merged: dict[str, Any] = {"kind": "transformer", **MODEL_PRESETS[preset]}
        merged.update(raw)
        raw = merged
    kind = raw.get("kind", "uniform")
    if kind not in ("uniform", "transformer"):
        raise UserError("model.kind", f"unknown kind {kind!r}",
                        "use \"uniform\", \"transformer\", or preset = NAME")
    allowed = ("kind", "num_layers") + (LAYER_FIELDS + ("embedding", "head")
                                        if kind == "uniform" else ARCH_FIELDS + ("builder",))
    for key in raw:
        if key not in allowed:
            raise UserError(f"model.{key}", f"unknown key for a {kind} model",
                            _suggest(key, allowed))
    if "num_layers" not in raw:
        raise UserError("model.num_layers", "missing", "set num_layers = N")
    n = _check_type("model.num_layers", raw["num_layers"], int)
    if n < 1:
        raise UserError("model.num_layers", f"must be at least 1, got {n}", "set num_layers >= 1")
    if kind == "transformer":
        builder = raw.get("builder", "module:function")
        if not isinstance(builder, str) or not builder.rpartition(":")[0]:
            raise UserError("model.builder", f"{builder!r} is not \"module:function\"",
                            "write e.g. builder = \"ppsim.executor.builders.llama:build\"")
        _check_transformer(raw)
    return raw


_CHOICES = {"recompute": RECOMPUTE, "dtype": tuple(DTYPE_BYTES), "attention": ATTENTION,
            "norm": NORMS, "position": POSITIONS}
_POSITIVE = ("tp", "dp", "ep", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
             "vocab_size", "seq_length", "micro_batch_size")
_COUNTS = ("mtp_layers", "head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
           "v_head_dim", "num_experts", "top_k", "moe_ffn_hidden_size", "shared_experts")


def _check_transformer(raw: dict[str, Any]) -> None:
    """Types and ranges of a transformer's fields (shapes are checked with the costs)."""
    for key, choices in _CHOICES.items():
        if key in raw and raw[key] not in choices:
            raise UserError(f"model.{key}", f"unknown value {raw[key]!r}",
                            "use " + " | ".join(choices))
    for key, low in [(k, 1) for k in _POSITIVE] + [(k, 0) for k in _COUNTS]:
        if key in raw and _check_type(f"model.{key}", raw[key], int) < low:
            raise UserError(f"model.{key}", f"must be at least {low}, got {raw[key]}",
                            "use a whole number >= " + str(low))
    for key in ("gated_mlp", "distributed_optimizer", "dropout"):
        if key in raw:
            _check_type(f"model.{key}", raw[key], bool)
    if "layers" in raw:
        _check_type("model.layers", raw["layers"], str)
    missing = [k for k in ("hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                           "vocab_size", "seq_length") if k not in raw]
    if missing:
        raise UserError(f"model.{missing[0]}", "missing for a transformer model",
                        f"set {missing[0]} = N, or use preset = NAME")


def _fill(obj: Any, table: dict[str, Any], section: str) -> None:
    types = {f.name: f.type for f in fields(obj)}
    for key, value in table.items():
        if key not in types:
            raise UserError(f"{section}.{key}", "unknown key", _suggest(key, list(types)))
        t = types[key]
        where = f"{section}.{key}"
        if value is None:
            if "None" not in t:  # TOML has no null, but dicts from code and JSON do
                raise UserError(where, "must have a value, got None", f"write a {t}")
            setattr(obj, key, None)
        elif "list" in t:
            if value == "even":
                setattr(obj, key, value)
                continue
            if not isinstance(value, list):
                raise UserError(where, f"expected a list of integers, got {value!r}"[:200],
                                "write e.g. split = [6, 2]")
            setattr(obj, key, value)  # element checks: validate.pipeline and ppsim.split
        elif t.startswith("int"):
            setattr(obj, key, _check_type(where, value, int))
        elif t.startswith("float"):
            setattr(obj, key, _check_type(where, value, float))
        elif t.startswith("bool"):
            setattr(obj, key, _check_type(where, value, bool))
        else:
            setattr(obj, key, _check_type(where, value, str))


def config_from_dict(data: dict[str, Any]) -> Config:
    for key in data:
        if key not in ("model", "pipeline", "hardware", "placement", "costs_file"):
            raise UserError(key, "unknown section",
                            "use [model], [pipeline], [hardware] and [placement]")
    cfg = Config(model=dict(validate.table("model", data.get("model", {}))))
    validate.preset_name("model.preset", cfg.model.get("preset"))
    check_config(cfg, validate.table("pipeline", data.get("pipeline", {})))
    cfg.hardware = hardware_config(dict(validate.table("hardware", data.get("hardware", {}))))
    _fill(cfg.placement, validate.table("placement", data.get("placement", {})), "placement")
    validate.placement(cfg.placement)
    if "costs_file" in data:
        cfg.costs_file = _check_type("costs_file", data["costs_file"], str)
    return cfg


def check_config(cfg: Config, pipeline: dict[str, Any] | None = None) -> None:
    """Validate cfg's model and pipeline (after filling `pipeline` in, if given)."""
    fields_ = model_fields(cfg.model)
    validate.model(fields_)
    if pipeline is not None:
        _fill(cfg.pipeline, pipeline, "pipeline")
    validate.pipeline(cfg.pipeline)


def hardware_config(table: dict[str, Any]) -> HardwareConfig:
    """A [hardware] table, merged onto its preset when it names one."""
    preset = validate.preset_name("hardware.preset", table.get("preset"))
    if preset is not None:
        if preset not in HARDWARE_PRESETS:
            raise UserError("hardware.preset", f"unknown preset {preset!r}",
                            "choose one of " + ", ".join(HARDWARE_PRESETS))
        table = {**HARDWARE_PRESETS[preset], **table}
    hw = HardwareConfig()
    _fill(hw, table, "hardware")
    validate.hardware(hw)
    return hw


def parse_toml(text: str, source: str = "config") -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(source, f"malformed TOML: {exc}", "fix the syntax on that line") from None
    except RecursionError:
        raise UserError(source, "malformed TOML: nested too deeply",
                        "a config needs only [model], [pipeline] and [hardware] tables") from None


def load_config(path: str | None) -> Config:
    """Load a config file, or the embedded default when path is None."""
    if path is None:
        return config_from_dict(parse_toml(DEFAULT_TOML, "default config"))
    text = validate.read_text("--config", path, validate.MAX_CONFIG_BYTES, "TOML config file")
    cfg = config_from_dict(parse_toml(text, path))
    if cfg.costs_file and not os.path.isabs(cfg.costs_file):
        # A cost file named in a config lives next to that config.
        cfg.costs_file = os.path.join(os.path.dirname(os.path.abspath(path)), cfg.costs_file)
    csv = cfg.pipeline.actions_csv
    if csv and not os.path.isabs(csv):
        cfg.pipeline.actions_csv = os.path.join(os.path.dirname(os.path.abspath(path)), csv)
    return cfg


# ------------------------------------------------------------------ saving


_TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n",
                 "\f": "\\f", "\r": "\\r"}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + "".join(_TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20
                             or ord(c) == 0x7F else c) for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def config_to_toml(cfg: Config) -> str:
    """Serialise a config so load_config reads it back to an equal Config."""
    lines = ["[model]"]
    tables = []
    for k, v in cfg.model.items():
        if isinstance(v, dict):
            tables.append((f"model.{k}", v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for name, table in tables:
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    sections: list[tuple[str, Any]] = [("pipeline", cfg.pipeline), ("hardware", cfg.hardware)]
    if cfg.placement != PlacementConfig():
        sections.append(("placement", cfg.placement))
    for section, obj in sections:
        lines += ["", f"[{section}]"]
        for f in fields(obj):
            v = getattr(obj, f.name)
            if v is not None:
                lines.append(f"{f.name} = {_toml_value(v)}")
    if cfg.costs_file:
        lines = [f"costs_file = {_toml_value(cfg.costs_file)}", ""] + lines
    return "\n".join(lines) + "\n"
