"""A memory policy as Megatron-LM flags, refused where Megatron refuses it; which
framework can run a per-stage policy.

Megatron-Core runs one recompute setting for every stage: selective granularity
with a module list, or full granularity with the block method and one N (the
first N layers of each stage) or the uniform method (every layer). Its
fine-grained offload takes one module list, one fraction (of the offload groups,
which ppsim prices as the same share of their bytes) and a per-pp-rank delta in
bytes (ppsim.policy.delta); it runs on Transformer Engine's modules. torchtitan
applies one activation checkpoint policy to every block; ppsim's executor runs any
policy (its builders have every module as a piece of its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs.arch import Architecture
from ppsim.costs.op_sac import OP_SAC_MODULE
from ppsim.errors import UserError
from ppsim.policy.model import ALL_LAYERS, StagePolicy

NO_POLICY_FLAGS = ("none: Megatron's default, so leave out any --recompute-* flag and "
                   "--fine-grained-activation-offloading (over a ppsim preset that "
                   "recomputes: --recompute none)")
"""What to do with a job's memory-policy flags when the policy recomputes and offloads
nothing: the base job (a preset's selective recompute) may carry some."""


@dataclass(frozen=True, kw_only=True)
class PolicyExport:
    """Flags of a policy and what they need."""

    megatron_flags: list[str] | None
    """Megatron argv tokens; None when Megatron cannot run the policy."""
    notes: list[str]
    """What the flags need, or why there are none."""
    frameworks: list[str]
    """Which frameworks can run the policy as given."""


def _uniform(policies: tuple[StagePolicy, ...]) -> StagePolicy | None:
    """The shared policy when Megatron's one setting for all stages says it; None
    otherwise (its per-rank delta keeps whole groups per iteration, ppsim.policy.delta:
    it cannot lower one rank's fraction for every microbatch)."""
    first = policies[0]
    for p in policies:
        if (p.recompute_modules, p.recompute_layers, p.offload_modules) != (
                first.recompute_modules, first.recompute_layers, first.offload_modules) or \
                abs((p.offload_fraction if p.offloads else 0.0) - (
                    first.offload_fraction if first.offloads else 0.0)) > 1e-9:
            return None
    return first


def recompute_refusal(modules: tuple[str, ...], a: Architecture,
                      shared_overlap: bool = False) -> str | None:
    """Megatron's words where TransformerConfig refuses these recompute modules for the
    model (`shared_overlap`: --moe-shared-expert-overlap); None where it takes them."""
    if "mla_up_proj" in modules and a.attention != "mla":
        return "mla_up_proj in recompute_modules is only supported with multi_latent_attention."
    if a.fp8 and a.fp8_recipe == "delayed" and {"moe_act", "layernorm"} & set(modules):
        return "Delayed scaling does not support moe_act and layernorm recompute for fp8."
    if "shared_experts" in modules and a.shared_width and shared_overlap:
        return "shared_experts recompute cannot work with --moe-shared-expert-overlap."
    return None


def offload_refusal(recompute: tuple[str, ...], offload: tuple[str, ...]) -> str | None:
    """Megatron's words where TransformerConfig refuses these offload modules beside these
    recompute modules; None where it takes them."""
    if "attn_proj" in offload and "core_attn" not in offload:
        return ("attn_proj cannot be set to offload_modules alone without core_attn because "
                "the input of attn_proj is the output of core_attn, which is needed in "
                "core_attn.backward().")
    inside = sorted({"moe_act", "expert_fc1"} & set(offload))
    if "moe" in recompute and inside:
        names = "{" + ", ".join(repr(m) for m in inside) + "}"
        return (f"Cannot offload {names} while recomputing the entire MoE layer. 'moe' in "
                "recompute_modules wraps the full MoE forward in a checkpoint, so offloading "
                "activations inside it is redundant and will cause errors.")
    return None


def check_recompute(modules: tuple[str, ...], a: Architecture, shared_overlap: bool) -> None:
    """UserError naming memory.recompute_modules where Megatron refuses them (an offload
    set Megatron refuses is the executor's to run: policy_export says Megatron cannot)."""
    refusal = recompute_refusal(modules, a, shared_overlap)
    if refusal:
        raise UserError("memory.recompute_modules", refusal,
                        "drop the module Megatron names, or change what it needs")


@dataclass(frozen=True, kw_only=True)
class StageFlags:
    """Megatron's flags for one part of a stage's policy, and what a user should know."""

    flags: list[str]
    notes: list[str]


def recompute_flags(p: StagePolicy, a: Architecture) -> StageFlags:
    """Megatron's flags of one stage's recompute setting; UserError where Megatron refuses."""
    if p.recompute_layers and p.recompute_modules:
        raise UserError("memory.recompute_layers", "Megatron takes --recompute-num-layers "
                        "only with --recompute-granularity full, not with recompute modules",
                        "use modules or N, or run the policy with ppsim's executor")
    check_recompute(p.recompute_modules, a, False)
    if p.recompute_layers >= ALL_LAYERS:
        return StageFlags(flags=["--recompute-granularity", "full", "--recompute-method",
                                 "uniform", "--recompute-num-layers", "1"], notes=[])
    if p.recompute_layers:
        return StageFlags(flags=["--recompute-granularity", "full", "--recompute-method",
                                 "block", "--recompute-num-layers", str(p.recompute_layers)],
                          notes=[])
    if not p.recompute_modules:
        return StageFlags(flags=[], notes=[])
    flags = ["--recompute-granularity", "selective", "--recompute-modules",
             *p.recompute_modules]
    if "moe_act" not in p.recompute_modules:
        return StageFlags(flags=flags, notes=[])
    return StageFlags(flags=[*flags, "--moe-grouped-gemm"],
                      notes=["moe_act recompute needs grouped GEMM (--moe-grouped-gemm)"])


def offload_flags(p: StagePolicy, step_bytes: int) -> StageFlags:
    """Megatron's flags of one stage's offload setting and its per-rank delta in bytes."""
    if not p.offloads:
        return StageFlags(flags=[], notes=[])
    flags = ["--fine-grained-activation-offloading", "--offload-modules", *p.offload_modules]
    if p.offload_fraction < 1:
        flags += ["--activation-offload-fraction", f"{p.offload_fraction:g}"]
    if step_bytes:
        flags += ["--delta-offload-bytes-across-pp-ranks", str(step_bytes)]
    return StageFlags(flags=flags, notes=["offload runs on Transformer Engine's modules "
                                          "(--transformer-impl transformer_engine)"])


def policy_export(policies: tuple[StagePolicy, ...], a: Architecture,
                  step_bytes: int = 0) -> PolicyExport:
    """Megatron's flags of the policy and the frameworks that run it; `step_bytes`: the
    per-rank offload delta (ppsim.policy.costs.Delta) it is priced with."""
    if any(OP_SAC_MODULE in p.recompute_modules for p in policies):
        return PolicyExport(megatron_flags=None, frameworks=["torchtitan"], notes=[
            "torchtitan's SelectiveAC (activation-checkpoint:selective) saves per op; "
            "Megatron and ppsim's executor have no such policy"])
    frameworks = ["ppsim executor"]
    if len({(p.recompute_modules, p.recompute_layers) for p in policies}) == 1 and not any(
            p.offloads for p in policies) and policies[0].recompute_layers in (0, ALL_LAYERS):
        frameworks.append("torchtitan (one checkpoint policy for every block)")
    p = _uniform(policies)
    if p is None:
        return PolicyExport(megatron_flags=None, frameworks=frameworks, notes=[
            "Megatron runs one recompute setting and one offload fraction for every "
            "stage; this policy differs per stage"])
    try:
        recompute = recompute_flags(p, a)
    except UserError as e:
        return PolicyExport(megatron_flags=None, frameworks=frameworks, notes=[str(e)])
    refusal = offload_refusal(p.recompute_modules, p.offload_modules) if p.offloads else None
    if refusal:
        return PolicyExport(megatron_flags=None, frameworks=frameworks, notes=[refusal])
    offload = offload_flags(p, step_bytes)
    return PolicyExport(megatron_flags=recompute.flags + offload.flags,
                        notes=recompute.notes + offload.notes,
                        frameworks=["Megatron-LM", *frameworks])
