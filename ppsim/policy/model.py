"""A memory policy: per virtual stage, what is recomputed and what is offloaded.

The knobs are Megatron-Core's: a set of recompute modules
(`--recompute-modules`), a block count N (`--recompute-method block
--recompute-num-layers N`: the first N layers of the stage recomputed whole), a set
of offload modules (`--offload-modules`) and the fraction of their tensors moved to
host memory. The global `recompute` mode is shorthand for a uniform policy: "none"
no modules, "selective" core_attn, "full" every layer block-recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ppsim.costs.arch import Architecture
from ppsim.costs.modules import OFFLOAD_MODULES, RECOMPUTE_MODULES, SHORTHAND
from ppsim.costs.op_sac import OP_SAC, op_sac_refusal
from ppsim.errors import UserError, one_of

ALL_LAYERS = 1 << 30
"""A block count that covers every layer of any stage (the "full" mode)."""


@dataclass(frozen=True, kw_only=True)
class StagePolicy:
    """What one virtual stage recomputes and offloads."""

    recompute_modules: tuple[str, ...] = ()
    """Megatron module names recomputed in every layer not block-recomputed."""
    recompute_layers: int = 0
    """N: the stage's first N layers are recomputed whole (keep only their input)."""
    offload_modules: tuple[str, ...] = ()
    """Megatron module names whose saved tensors go to host memory."""
    offload_fraction: float = 0.0
    """Share of those tensors' bytes offloaded (0: none, 1: all)."""

    def to_dict(self, stage: int, layers: int | None = None) -> dict[str, Any]:
        """The JSON entry of this policy on virtual stage `stage` (N capped at `layers`)."""
        n = self.recompute_layers if layers is None else min(self.recompute_layers, layers)
        return {"stage": stage, "recompute_modules": list(self.recompute_modules),
                "recompute_layers": n, "offload_modules": list(self.offload_modules),
                "offload_fraction": self.offload_fraction if self.offload_modules else 0.0}

    @property
    def offloads(self) -> bool:
        return bool(self.offload_modules) and self.offload_fraction > 0

    def label(self) -> str:
        """Short text for tables: "core_attn N=3 offload 50% core_attn"; "none" for
        a policy that recomputes and offloads nothing."""
        parts = [",".join(self.recompute_modules)] if self.recompute_modules else []
        if self.recompute_layers:
            parts.append("N=all" if self.recompute_layers >= ALL_LAYERS
                         else f"N={self.recompute_layers}")
        if self.offloads:
            parts.append(f"offload {self.offload_fraction:.0%} {','.join(self.offload_modules)}")
        return " ".join(parts) or "none"


MODES = ("none", "selective", "full")
"""Megatron's global recompute modes, cheapest first."""
TORCHTITAN_MODES = ("none", OP_SAC, "full")
"""torchtitan's activation checkpointing (none, SelectiveAC, FullAC), cheapest first."""


def mode_ladder(a: Architecture) -> tuple[str, ...]:
    """The global modes a model's job is searched over, cheapest first: torchtitan's
    where it runs torchtitan's SelectiveAC or shards as torchtitan does (SelectiveAC left
    out where ppsim does not price it for the model), else Megatron's."""
    if a.recompute != OP_SAC and not a.torchtitan_fsdp:
        return MODES
    return TORCHTITAN_MODES if not op_sac_refusal(a) else ("none", "full")


def shorthand(mode: str) -> StagePolicy:
    """The uniform policy the global --recompute mode means."""
    if mode == "full":
        return StagePolicy(recompute_layers=ALL_LAYERS)
    return StagePolicy(recompute_modules=SHORTHAND.get(mode, ()))


POLICY_KEYS = ("recompute_modules", "recompute_layers", "offload_modules", "offload_fraction")
"""The keys of a [memory] table or a [[memory.stage]] table."""

UNPRICED_MODULES = {"gdn_norm_out": "recompute", "gdp_in_proj": "recompute",
                    "gdp_qkv": "recompute or offload", "mhc": "recompute",
                    "fused_group_mlp": "offload"}
"""Megatron's modules ppsim has no cost for, and which of its lists takes each."""


def _unknown_module(where: str, name: str, allowed: tuple[str, ...]) -> UserError:
    """The error for a module name `allowed` lacks: Megatron's that ppsim does not price,
    one of the other list's, or the close names."""
    if name in UNPRICED_MODULES:
        return UserError(where, f"Megatron's {UNPRICED_MODULES[name]} module {name!r} is not "
                         "priced by ppsim", "drop it; ppsim prices " + ", ".join(allowed))
    this, other = ("offload", "recompute") if allowed == OFFLOAD_MODULES else \
        ("recompute", "offload")
    if name in RECOMPUTE_MODULES + OFFLOAD_MODULES:
        return UserError(where, f"{name!r} is one of Megatron's {other} modules, not its "
                         f"{this} modules", f"move it to {other}_modules, or use "
                         + ", ".join(allowed))
    return UserError(where, f"unknown module {name!r}", one_of(name, allowed))


def module_names(where: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A list (or comma/space-separated text) of Megatron module names, checked."""
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise UserError(where, f"expected a list of module names, got {value!r}"[:200],
                        "write e.g. [\"core_attn\", \"mlp\"]")
    for v in value:
        if v not in allowed:
            raise _unknown_module(where, v, allowed)
    return tuple(dict.fromkeys(value))  # Megatron's order as given, once each


def stage_policy(where: str, table: dict[str, Any], base: StagePolicy) -> StagePolicy:
    """A [memory] table (or one per-stage table) over `base`."""
    for key in table:
        if key not in POLICY_KEYS and key != "stage":
            raise UserError(f"{where}.{key}", "unknown key", one_of(key, POLICY_KEYS))
    out = dict(recompute_modules=base.recompute_modules, recompute_layers=base.recompute_layers,
               offload_modules=base.offload_modules, offload_fraction=base.offload_fraction)
    if "recompute_modules" in table:
        out["recompute_modules"] = module_names(f"{where}.recompute_modules",
                                                table["recompute_modules"], RECOMPUTE_MODULES)
    if "offload_modules" in table:
        out["offload_modules"] = module_names(f"{where}.offload_modules",
                                              table["offload_modules"], OFFLOAD_MODULES)
        if "offload_fraction" not in table and not base.offload_fraction:
            out["offload_fraction"] = 1.0  # Megatron's --activation-offload-fraction default
    if "recompute_layers" in table:
        n = table["recompute_layers"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > ALL_LAYERS:
            raise UserError(f"{where}.recompute_layers", f"must be a whole number >= 0, got "
                            f"{n!r}"[:200], "give N, the stage's first N layers recomputed")
        out["recompute_layers"] = n
    if "offload_fraction" in table:
        f = table["offload_fraction"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
            raise UserError(f"{where}.offload_fraction", f"must be in [0, 1], got {f!r}"[:200],
                            "give the share of the modules' tensors offloaded, e.g. 0.5")
        out["offload_fraction"] = float(f)
    return StagePolicy(**out)


@dataclass(frozen=True, kw_only=True)
class MemoryPolicy:
    """One StagePolicy per virtual stage (stages without one take `default`)."""

    default: StagePolicy
    """The policy of every stage the per-stage tables do not name."""
    stages: tuple[tuple[int, StagePolicy], ...] = ()
    """(virtual stage, its policy) for the stages given their own."""
    offload_step_bytes: int = 0
    """Megatron's --delta-offload-bytes-across-pp-ranks: pp rank r keeps r x this many
    bytes of offload groups per iteration on the device (ppsim.policy.delta)."""

    def of(self, stage: int) -> StagePolicy:
        for i, p in self.stages:
            if i == stage:
                return p
        return self.default

    @property
    def uniform(self) -> bool:
        return not self.stages


def offload_step_bytes(step: Any) -> int:
    """[memory] offload_step_bytes, checked: a whole number of bytes >= 0."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UserError("memory.offload_step_bytes", f"must be a whole number of bytes >= 0, "
                        f"got {step!r}"[:200], "give the bytes each pp rank keeps more")
    return step


def op_sac_memory_refusal(table: dict[str, Any], mode: str) -> None:
    """UserError where a [memory] table sets a policy over torchtitan's SelectiveAC: it
    is one checkpoint policy for every block (torchtitan takes no per-stage or
    per-module setting), and Megatron's modules, block N or offload on top of it are
    neither priced nor run by any framework."""
    keys = [k for k in (*POLICY_KEYS, "offload_step_bytes", "stage") if k in table]
    if mode == OP_SAC and keys:
        raise UserError(f"memory.{keys[0]}", f"recompute {OP_SAC} is torchtitan's "
                        "SelectiveAC, one policy for every block; Megatron's modules, block N "
                        "and offload do not go on it", "drop the [memory] keys, or set "
                        "[model] recompute to none, selective or full")


def memory_policy(table: dict[str, Any], mode: str, num_stages: int | None = None
                  ) -> MemoryPolicy:
    """A [memory] section (with [[memory.stage]] tables) over the global `mode`."""
    op_sac_memory_refusal(table, mode)
    per = table.get("stage", [])
    step = offload_step_bytes(table.get("offload_step_bytes", 0))
    base = stage_policy("memory", {k: v for k, v in table.items()
                                   if k not in ("stage", "offload_step_bytes")},
                        shorthand(mode))
    if not isinstance(per, list) or not all(isinstance(t, dict) for t in per):
        raise UserError("memory.stage", "expected [[memory.stage]] tables",
                        "write [[memory.stage]] with stage = I and the keys to change")
    stages: dict[int, StagePolicy] = {}
    for t in per:
        i = t.get("stage")
        if isinstance(i, bool) or not isinstance(i, int) or i < 0 or (
                num_stages is not None and i >= num_stages):
            raise UserError("memory.stage.stage", f"bad virtual stage {i!r}"[:200],
                            "give stage = I, 0 <= I < pp x vpp")
        if i in stages:
            raise UserError("memory.stage.stage", f"stage {i} given twice", "give it once")
        stages[i] = stage_policy(f"memory.stage[{i}]", t, base)
    if step and not base.offload_modules:
        raise UserError("memory.offload_step_bytes", "steps the offload down each pp rank, "
                        "but no offload_modules are set", "add offload_modules "
                        "(--offload-modules), or drop the step")
    return MemoryPolicy(default=base, stages=tuple(sorted(stages.items())),
                        offload_step_bytes=step)
