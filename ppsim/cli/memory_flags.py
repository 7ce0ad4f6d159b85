"""The memory policy's flags, ppsim's and Megatron's: the [memory] keys they set and the
global recompute mode they say. A value the [memory] rules refuse is refused in the name
of the flag that gave it, as the user typed it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ppsim.cli import megatron_flags
from ppsim.cli.flag_values import nonempty
from ppsim.errors import UserError
from ppsim.policy.model import StagePolicy, offload_step_bytes, stage_policy

MEMORY_FLAGS = {"recompute_modules": "recompute_modules",
                "recompute_layers": "recompute_num_layers",
                "offload_modules": "offload_modules", "offload_fraction": "offload_fraction",
                "offload_step_bytes": "delta_offload_bytes_across_pp_ranks"}
"""[memory] key -> the flag that sets it."""


class _Typed(argparse.Action):
    """A flag with two names: keeps which one was typed (`flag_names`), so an error names
    that one (--offload-fraction or Megatron's --activation-offload-fraction)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.flag_names = {**(getattr(namespace, "flag_names", None) or {}),
                                self.dest: option_string}


def add_memory_policy_flags(g: Any) -> None:
    """The memory policy as Megatron's flags: recompute and offload (sets [memory])."""
    g.add_argument("--recompute", metavar="MODE",
                   help="none | selective | full | op-sac (torchtitan's SelectiveAC)")
    module = nonempty("a Megatron module name")
    g.add_argument("--recompute-modules", nargs="+", metavar="M", type=module,
                   help="Megatron modules recomputed in every layer: core_attn mlp "
                   "moe_act layernorm mla_up_proj moe shared_experts (sets [memory])")
    g.add_argument("--recompute-num-layers", type=int, metavar="N", help="the first N layers "
                   "of each stage recomputed whole (Megatron's block method)")
    g.add_argument("--recompute-activations", action="store_true", default=None,
                   help="Megatron's short form of --recompute-granularity selective")
    g.add_argument("--moe-layer-recompute", action="store_true", default=None,
                   help="Megatron's older form of --recompute-modules moe (beside "
                   "core_attn unless modules are given)")
    g.add_argument("--recompute-granularity", choices=("full", "selective"),
                   help="Megatron's: selective (core_attn, or --recompute-modules) or full "
                   "(with --recompute-method)")
    g.add_argument("--recompute-method", choices=("uniform", "block"), help="Megatron's, "
                   "with full granularity: uniform (every layer, --recompute-num-layers 1) or "
                   "block (--recompute-num-layers N)")
    g.add_argument("--moe-grouped-gemm", action="store_true", default=None,
                   help="accepted as Megatron takes it (moe_act recompute needs it there)")
    g.add_argument("--offload-modules", nargs="+", metavar="M", type=module,
                   help="Megatron modules whose saved tensors go to host memory (with "
                   "--fine-grained-activation-offloading): attn_norm qkv_linear core_attn "
                   "attn_proj mlp_norm expert_fc1 moe_act")
    g.add_argument("--offload-fraction", "--activation-offload-fraction",
                   dest="offload_fraction", type=float, metavar="F", action=_Typed,
                   help="share of the offload modules' tensors offloaded (default 1)")
    g.add_argument("--fine-grained-activation-offloading", action="store_true", default=None,
                   help="Megatron's switch the offload flags need (without it Megatron "
                   "offloads nothing)")
    g.add_argument("--delta-offload-bytes-across-pp-ranks", type=int, metavar="BYTES",
                   help="Megatron's per-rank offload delta: pp rank r keeps r x this many "
                   "bytes of offload groups per iteration on the device")


def _check_values(memory: dict[str, Any], typed: dict[str, str]) -> None:
    """Each flag's value under the [memory] rules (ppsim.policy.model, their one home),
    refused in the flag's name (`typed`: dest -> the name given) rather than the key's."""
    for key, value in memory.items():
        dest = MEMORY_FLAGS[key]
        try:
            if key == "offload_step_bytes":
                offload_step_bytes(value)
            else:
                stage_policy("memory", {key: value}, StagePolicy())
        except UserError as exc:
            name = typed.get(dest) or "--" + dest.replace("_", "-")
            raise UserError(name, exc.problem, exc.fix) from None


@dataclass(frozen=True)
class MemoryFlags:
    """What the memory policy's flags say."""

    memory: dict[str, Any]
    """The [memory] keys they set."""
    mode: str | None
    """The global recompute mode they say, if any."""


def memory_flags(flag: Any, configured: dict[str, Any] | None) -> MemoryFlags:
    """What the flags say of the memory policy (`configured`: the config's [memory]
    section)."""
    memory = {key: flag(name) for key, name in MEMORY_FLAGS.items() if flag(name) is not None}
    for key in ("recompute_modules", "offload_modules"):  # "a,b", "a b" or a b
        if isinstance(memory.get(key), list):
            memory[key] = " ".join(memory[key])
            if not memory[key].replace(",", " ").split():  # "," (nonempty takes "")
                raise UserError(f"--{key.replace('_', '-')}", "names no module (Megatron "
                                f"refuses {memory[key]!r} as a module name)",
                                "give the modules, or leave the flag out")
    _check_values(memory, flag("flag_names") or {})
    # As Megatron's arguments.py: --recompute-activations sets selective, whatever
    # --recompute-granularity says.
    granularity = "selective" if flag("recompute_activations") else \
        flag("recompute_granularity")
    named = "--recompute-activations" if flag("recompute_activations") else \
        "--recompute-granularity"
    if flag("moe_layer_recompute"):
        named = "--moe-layer-recompute" if granularity is None else named
        granularity = megatron_flags.moe_layer_recompute(granularity, memory)
    if flag("recompute_method") and flag("overlap_moe_expert_parallel_comm"):
        raise UserError("--recompute-method", "disable recomputation method when enabling "
                        "overlap_moe_expert_parallel_comm (Megatron's words)",
                        "drop --recompute-method, or --overlap-moe-expert-parallel-comm")
    mode = megatron_flags.recompute_mode(granularity, flag("recompute_method"), memory,
                                         flag("recompute"), bool(flag("moe_grouped_gemm")),
                                         named)
    stages = (configured or {}).get("stage")
    tables = [configured or {}, *(stages if isinstance(stages, list) else [])]
    megatron_flags.check_offload(bool(flag("fine_grained_activation_offloading")), memory,
                                 any(isinstance(t, dict) and t.get("offload_modules")
                                     for t in tables))
    return MemoryFlags(memory, mode)
