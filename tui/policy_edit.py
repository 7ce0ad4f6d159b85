"""Pure editing of the per-stage memory policy the split editor shows.

Each virtual stage has a `ppsim.policy.model.StagePolicy` (Megatron's knobs:
recompute modules, block N = recompute_layers, offload modules and fraction). The
keys step through the choices that mean something for the model (a module set the
model's layers do not have is the same as a smaller one); every function returns a
new value or raises `EditRefused` with the reason, nothing half-applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ppsim.costs.modules import applies
from ppsim.costs.op_sac import OP_SAC
from ppsim.costs.transformer import layer_kinds
from ppsim.policy.model import ALL_LAYERS, MODES, StagePolicy, shorthand
from ppsim.policy.search import MODULE_SETS, OFFLOAD_SETS
from ppsim.tui.editing import EditRefused

FRACTION_STEP = 0.25
"""How much one key press moves a stage's offload fraction."""
KNOBS = ("modules", "layers", "offload", "fraction")
"""What a policy key edits: recompute modules, block N, offload modules, fraction."""

Policies = tuple[StagePolicy, ...]


def _present(modules: Sequence[str], arch: Any, kinds: Sequence[str]) -> tuple[str, ...]:
    """The modules of the set that some layer of the model has."""
    ks = set(kinds) - {"mtp"} or {"dense"}
    return tuple(m for m in modules if any(applies(m, arch, k) for k in ks))


def module_choices(arch: Any, kinds: Sequence[str]) -> list[tuple[str, ...]]:
    """Recompute module sets to step through: the planner's sets, each as the model
    has it, once each, in the planner's order (no modules first)."""
    return list(dict.fromkeys(_present(m, arch, kinds) for m in MODULE_SETS))


def offload_choices(arch: Any, kinds: Sequence[str]) -> list[tuple[str, ...]]:
    """Offload module sets to step through, nothing first."""
    return list(dict.fromkeys([()] + [_present(o, arch, kinds) for o in OFFLOAD_SETS]))


def step_choice(current: tuple[str, ...], choices: Sequence[tuple[str, ...]],
                step: int) -> tuple[str, ...]:
    """The next (step 1) or previous (-1) choice; a current set that is not among
    them (typed in a config) steps to the first or last."""
    if current not in choices:
        return choices[0 if step > 0 else -1]
    return choices[(list(choices).index(current) + step) % len(choices)]


OP_SAC_REFUSAL = (f"{OP_SAC} is torchtitan's one policy for every block; choose recompute "
                  "none, selective or full to set one per stage")
"""Why neither the policy keys nor the policy planner set a per-stage policy on op-sac."""


def stage_policies(explicit: Policies, mode: str, num_stages: int) -> Policies:
    """Each virtual stage's policy: the explicit ones when there is one per stage,
    else every stage on the global recompute mode's shorthand."""
    if len(explicit) == num_stages:
        return explicit
    return (shorthand(mode if mode in MODES else "none"),) * num_stages


def edit_policy(policy: StagePolicy, knob: str, step: int, layers: int,
                modules: Sequence[tuple[str, ...]],
                offload: Sequence[tuple[str, ...]]) -> StagePolicy:
    """`policy` with one knob stepped: the module sets to the next/previous choice,
    N by `step` within 0..layers, the fraction by FRACTION_STEP within 0..1."""
    if knob == "modules":
        return replace(policy, recompute_modules=step_choice(policy.recompute_modules,
                                                             modules, step))
    if knob == "layers":
        n = min(policy.recompute_layers, layers) + step
        if not 0 <= n <= layers:
            raise EditRefused("block N", f"must be within 0..{layers} (the stage's layers)")
        return replace(policy, recompute_layers=n)
    if knob == "offload":
        mods = step_choice(policy.offload_modules, offload, step)
        frac = policy.offload_fraction or (1.0 if mods else 0.0)
        return replace(policy, offload_modules=mods, offload_fraction=frac if mods else 0.0)
    if knob == "fraction":
        if not policy.offload_modules:
            raise EditRefused("offload fraction", "the stage offloads no modules; "
                              "choose some first (o)")
        f = round(policy.offload_fraction + step * FRACTION_STEP, 6)
        return replace(policy, offload_fraction=min(1.0, max(0.0, f)))
    raise EditRefused("policy", f"no knob {knob!r}; use one of {', '.join(KNOBS)}")


def with_stage(policies: Policies, stage: int, policy: StagePolicy) -> Policies:
    """The per-stage policies with stage `stage`'s replaced."""
    if not 0 <= stage < len(policies):
        raise EditRefused("policy", f"no stage {stage}")
    return policies[:stage] + (policy,) + policies[stage + 1:]


def memory_tables(policies: Policies) -> dict[str, Any]:
    """The [memory] override that runs exactly these policies: one [[memory.stage]]
    table per virtual stage, every key given (so the file's defaults do not leak in)."""
    return {"stage": [p.to_dict(i) for i, p in enumerate(policies)]}


def policy_text(policy: StagePolicy, layers: int) -> str:
    """A stage's policy in Megatron's words, N capped at its layers: "recompute
    core_attn · N 2/5 · offload 50% core_attn"."""
    n = min(policy.recompute_layers, layers)
    block = "all" if policy.recompute_layers >= ALL_LAYERS or (n == layers and n) else str(n)
    off = (f"{policy.offload_fraction:.0%} {','.join(policy.offload_modules)}"
           if policy.offloads else "-")
    return (f"recompute {','.join(policy.recompute_modules) or '-'} · N {block}/{layers} · "
            f"offload {off}")


def short_policy_text(policy: StagePolicy, layers: int) -> str:
    """The policy in few columns: "rc core_attn N2/5 off 50% core_attn"."""
    full = policy_text(policy, layers)
    return (full.replace("recompute ", "rc ").replace(" · N ", " N").replace(" · offload ", " off ")
            .replace("N all/", "Nall/"))


def policy_lines(stage: int, policy: StagePolicy, layers: int, width: int) -> list[str]:
    """The selected stage's policy worded for `width` columns: one line, the long form
    if it fits, else the short one, else the short one in two lines (recompute, then
    offload), each cut with "…" only when even that does not fit."""
    short = short_policy_text(policy, layers)
    for text in (f"stage {stage} {policy_text(policy, layers)}", f"s{stage} {short}"):
        if width <= 0 or len(text) <= width:
            return [text]
    head, _, off = f"s{stage} {short}".partition(" off ")
    return [cut(head, width), cut(f"   off {off}", width)]


def cut(text: str, width: int) -> str:
    """`text` within `width` columns, ending in "…" when it was longer."""
    return text if len(text) <= width else text[:max(1, width - 1)] + "…"


def policy_mark(policy: StagePolicy, layers: int) -> str:
    """One letter per stage row: "F" every layer recomputed, "N" some, "R" modules
    recomputed, "O" offloads (wins over the recompute letters), " " nothing."""
    if policy.offloads:
        return "O"
    n = min(policy.recompute_layers, layers)
    if n and n >= layers:
        return "F"
    if n:
        return "N"
    return "R" if policy.recompute_modules else " "


def choices_for(model: Any) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]] | None:
    """(recompute module sets, offload module sets) for a transformer model; None
    for a model with uniform costs (no op lists, so no policy)."""
    arch = getattr(model, "arch", None)
    if arch is None or getattr(model, "recompute", None) is None:
        return None
    kinds = layer_kinds(arch)
    return module_choices(arch, kinds), offload_choices(arch, kinds)
