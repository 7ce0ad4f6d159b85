"""The [model] section, typed: one dataclass per kind, parsed once from the table.

`parse_model` merges a table onto its preset, checks it (ppsim.config.validate) and
returns a `UniformModel` or a `TransformerModel`; callers branch on the type.
`to_dict` gives the table back (a preset and what differs from it), so a saved
config reads back equal; `fields` gives every field merged, the form builders and
cost files take.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any

from ppsim.config import validate
from ppsim.config.memo import frozen_items
from ppsim.config.presets import MODEL_PRESETS
from ppsim.costs.arch import Architecture
from ppsim.costs.hybrid import model_counts
from ppsim.costs.model import INTEGER_FIELDS, LAYER_FIELDS, LayerCost
from ppsim.errors import UserError, one_of

ARCH_FIELDS = tuple(f.name for f in fields(Architecture))
_LAYER_DEFAULTS = LayerCost()


@dataclass(frozen=True, kw_only=True)
class UniformModel:
    """kind = "uniform": every decoder layer costs the same, written in ms and bytes."""

    num_layers: int
    """Decoder layers."""
    layer: LayerCost = field(default_factory=LayerCost)
    """One decoder layer's costs: the table's forward_ms, backward_ms, ... fields."""
    embedding: LayerCost | None = None
    """[model.embedding]: the first stage's extra work; none: free."""
    head: LayerCost | None = None
    """[model.head]: the last stage's LM head and loss; none: free."""

    preset = None
    recompute = None
    """A uniform model has no recompute setting (its costs are given)."""
    mtp_layers = 0

    @property
    def total_layers(self) -> int:
        """Every layer a split places."""
        return self.num_layers

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "uniform", "num_layers": self.num_layers,
                               **_layer_dict(self.layer)}
        for name, cost in (("embedding", self.embedding), ("head", self.head)):
            if cost is not None:
                out[name] = _layer_dict(cost)
        return out

    def fields(self) -> dict[str, Any]:
        return self.to_dict()

    def with_fields(self, changes: dict[str, Any]) -> UniformModel | TransformerModel:
        return parse_model({**self.to_dict(), **changes})


@dataclass(frozen=True, kw_only=True)
class TransformerModel:
    """kind = "transformer" (or a preset): costs from the architecture and the hardware."""

    arch: Architecture
    """Shapes, layer kinds, MoE and MTP fields, parallel sizes, recompute."""
    preset: str | None = None
    """The preset the table starts from (ppsim presets); its other fields override it."""
    builder: str | None = None
    """"module:function" building the torch model for ppsim run and profile; none: the
    executor's default for the architecture."""

    @property
    def num_layers(self) -> int:
        return self.arch.num_layers

    @property
    def mtp_layers(self) -> int:
        return self.arch.mtp_layers

    @property
    def total_layers(self) -> int:
        """Every layer a split places: decoder layers, then MTP layers."""
        return self.arch.num_layers + self.arch.mtp_layers

    @property
    def recompute(self) -> str:
        return self.arch.recompute

    def to_dict(self) -> dict[str, Any]:
        """The table to save: the preset and the fields that differ from it."""
        if self.preset is not None:
            base = _preset_fields(self.preset)
            out: dict[str, Any] = {"preset": self.preset}
        else:
            base = _DEFAULTS
            out = {"kind": "transformer"}
        out.update({k: v for k, v in arch_fields(self.arch).items() if base.get(k) != v})
        if self.builder is not None:
            out["builder"] = self.builder
        return out

    def fields(self) -> dict[str, Any]:
        """Every field, merged: what a builder and a cost file's model record receive."""
        out: dict[str, Any] = {"kind": "transformer", **arch_fields(self.arch)}
        if self.builder is not None:
            out["builder"] = self.builder
        return out

    def with_fields(self, changes: dict[str, Any]) -> UniformModel | TransformerModel:
        key = frozen_items(changes)
        if key is None:  # a value no key can hold (a list): parsed uncached
            return parse_model({**self.to_dict(), **one_sharding(changes)})
        return _with_fields(self, key)


Model = UniformModel | TransformerModel


@lru_cache(maxsize=4096)
def _with_fields(model: TransformerModel, changes: tuple[tuple[str, type, Any], ...]
                 ) -> UniformModel | TransformerModel:
    """TransformerModel.with_fields, parsed once per model and changes (parse_model is a
    pure function of the table): a job search asks for the same sizes of one model for
    every pipeline shape. A refusal raises again each time (exceptions are not cached)."""
    given = {k: v for k, _, v in changes}
    return parse_model({**model.to_dict(), **one_sharding(given)})


def arch_fields(a: Architecture) -> dict[str, Any]:
    """An architecture's fields by name (all scalars: a shallow asdict)."""
    return {f.name: getattr(a, f.name) for f in fields(a)}


_DEFAULTS = {f.name: f.default for f in fields(Architecture)}


@lru_cache(maxsize=64)
def _preset_fields(name: str) -> dict[str, Any]:
    """A preset's fields (parsed once: job searches rebuild a config per shape). Read,
    never changed."""
    return arch_fields(parse_model({"preset": name}).arch)  # type: ignore[union-attr]


def one_sharding(given: dict[str, Any]) -> dict[str, Any]:
    """`given` fields over others: a sharding turned on (fsdp or distributed_optimizer)
    turns the other off unless `given` names both (FSDP over a preset whose replicas use
    the distributed optimizer is FSDP; both at once is refused)."""
    out = dict(given)
    for on, other in (("fsdp", "distributed_optimizer"), ("distributed_optimizer", "fsdp")):
        if out.get(on) is True and other not in out:
            out[other] = False
    return out


def _layer_dict(cost: LayerCost) -> dict[str, Any]:
    return {k: v for k, v in asdict(cost).items() if getattr(_LAYER_DEFAULTS, k) != v}


def _merged(table: dict[str, Any]) -> dict[str, Any]:
    """The table merged onto its preset (a preset means a transformer)."""
    raw = dict(validate.table("model", table))
    preset = validate.preset_name("model.preset", raw.pop("preset", None))
    if preset is None:
        return raw
    if preset not in MODEL_PRESETS:
        raise UserError("model.preset", f"unknown preset {preset!r}",
                        one_of(preset, MODEL_PRESETS))
    return {"kind": "transformer", **MODEL_PRESETS[preset], **one_sharding(raw),
            "preset": preset}


def parse_model(table: dict[str, Any]) -> Model:
    """A [model] table as its typed section; UserError naming the field otherwise."""
    raw = _merged(table)
    preset = raw.pop("preset", None)
    kind = raw.get("kind", "uniform")
    if kind not in ("uniform", "transformer"):
        raise UserError("model.kind", f"unknown kind {kind!r}",
                        "use \"uniform\", \"transformer\", or preset = NAME")
    allowed = ("kind", "num_layers") + (LAYER_FIELDS + ("embedding", "head")
                                        if kind == "uniform" else ARCH_FIELDS + ("builder",))
    for key in raw:
        if key not in allowed:
            raise UserError(f"model.{key}", f"unknown key for a {kind} model",
                            validate.suggest(key, allowed))
    if kind == "transformer":
        raw = _with_moe_defaults(raw)
    if kind == "transformer" and raw.get("hybrid_layer_pattern"):
        raw.update(model_counts(raw))  # the pattern's counts win, as in Megatron
    if "num_layers" not in raw:
        raise UserError("model.num_layers", "missing", "set num_layers = N")
    n = validate.typed("model.num_layers", raw["num_layers"], int)
    if n < 1:
        raise UserError("model.num_layers", f"must be at least 1, got {n}", "set num_layers >= 1")
    if kind == "uniform":
        return _uniform(raw)
    builder = raw.get("builder")
    if builder is not None and (not isinstance(builder, str) or not builder.rpartition(":")[0]):
        raise UserError("model.builder", f"{builder!r} is not \"module:function\"",
                        "write e.g. builder = \"ppsim.executor.builders.llama:build\"")
    validate.transformer(raw)
    arch = Architecture(**{k: v for k, v in raw.items() if k in ARCH_FIELDS})
    return TransformerModel(arch=arch, preset=preset, builder=builder)


TOP_K_FIX = "route each token to one expert or more (Megatron's --moe-router-topk, default 2)"


def _with_moe_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """A transformer table's routed experts with Megatron's defaults for what it leaves
    out, whether a config or Megatron's flags built it: top-k 2 and each expert as wide as
    the dense MLP (without them the experts took no token, or had no width); a top-k
    below 1 refused."""
    if not raw.get("num_experts"):
        return raw
    top_k = raw.get("top_k")
    if isinstance(top_k, int) and top_k < 1:
        raise UserError("model.top_k", f"must be at least 1 with num_experts = "
                        f"{raw['num_experts']}, got {top_k}", TOP_K_FIX)
    out = {**raw, "top_k": top_k or 2}
    if not out.get("moe_ffn_hidden_size"):
        out["moe_ffn_hidden_size"] = out.get("ffn_hidden_size")
    return out


def _uniform(raw: dict[str, Any]) -> UniformModel:
    subs = {}
    for name in ("embedding", "head"):
        if name in raw:
            subs[name] = _layer(validate.table(f"model.{name}", raw[name]), f"model.{name}")
    layer = _layer({k: v for k, v in raw.items() if k in LAYER_FIELDS}, "model")
    return UniformModel(num_layers=raw["num_layers"], layer=layer, **subs)


def _layer(table: dict[str, Any], where: str) -> LayerCost:
    for key in table:
        if key not in LAYER_FIELDS:
            raise UserError(f"{where}.{key}", "unknown key", "valid keys: " + ", ".join(
                LAYER_FIELDS))
    validate.layer_table(where, table)
    return LayerCost(**{k: int(v) if k in INTEGER_FIELDS else float(v)
                        for k, v in table.items()})


def model_fields(table: dict[str, Any]) -> dict[str, Any]:
    """Every field of a [model] table, merged onto its preset and checked: the dict a
    builder receives (ppsim.executor.builders) and a cost file records."""
    return parse_model(table).fields()
