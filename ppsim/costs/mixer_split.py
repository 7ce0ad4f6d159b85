"""How a hybrid stack's Mamba-2 and GatedDeltaNet mixers split over tensor and context
parallelism, as Megatron-LM splits them.

Tensor parallelism gives each rank 1 / tp of a mixer's heads (and of Mamba's groups).
Context parallelism is "all-to-all" CP (megatron/core/ssm/mamba_context_parallel.py;
gated_delta_net/common.py, a2a_cp_to_hp and a2a_hp_to_cp): each rank's in_proj output,
its 1 / cp of the sequence at all its heads, is exchanged for the whole sequence at
1 / cp of its heads before the conv and the scan, and the scan's gated output goes back
after; the backward mirrors both. A Mamba rank holding fewer groups than cp repeats its
B and C cp / (groups / tp) times first, so each context-parallel rank gets whole groups.
The rules refused here are Megatron's assertions, in its words.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs.arch import Architecture
from ppsim.costs.hybrid import parse_pattern
from ppsim.costs.mixers import delta_shape, mamba_shape
from ppsim.errors import UserError

SSM_KINDS = ("mamba", "gdn")
"""The mixers context parallelism splits by heads with all-to-alls."""


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """What one context-parallel all-to-all pair of a mixer moves, in elements a token
    per tensor-parallel rank."""

    before: int
    """The in_proj output, exchanged before the conv and the scan."""
    after: int
    """The scan's gated output, exchanged back after."""


def _mamba_problem(a: Architecture, tp: int, cp: int) -> tuple[str, str] | None:
    """(field, Megatron's message) where MambaMixer or MambaContextParallel asserts."""
    m = mamba_shape(a)
    heads, groups = m.heads, m.groups
    if heads % tp:
        return "model.tp", "nheads must be evenly divisble by tp_size"
    if groups % tp:
        return "model.tp", "ngroups must be evenly divisible by tp_size"
    if cp == 1:
        return None
    if (heads // tp) % cp:
        return "model.cp", "nheads must be evenly divisible by tp_size * cp_size"
    local = groups // tp
    if local < cp and cp % local:
        return "model.cp", "cp_size must be evenly divisible by ngroups/tp_size"
    if local >= cp and local % cp:
        return "model.cp", "ngroups must be evenly divisible by tp_size * cp_size"
    return None


def _gdn_problem(a: Architecture, tp: int, cp: int) -> tuple[str, str] | None:
    """(field, Megatron's message) where TransformerConfig asserts on GatedDeltaNet's key
    and value heads over tp x cp (its in_proj sections then split over cp too)."""
    for name in ("linear_num_key_heads", "linear_num_value_heads"):
        if getattr(a, name) % (tp * cp):
            return ("model.cp" if cp > 1 else "model.tp",
                    f"self.{name}={getattr(a, name)} must be a multiple of "
                    f"(self.tensor_model_parallel_size={tp} * "
                    f"self.context_parallel_size={cp}).")
    return None


def split_problem(a: Architecture, tp: int, cp: int) -> tuple[str, str] | None:
    """(field, message) for the first mixer of the stack Megatron cannot split over tp
    and cp; None when every one splits (and for a stack without Mamba or GDN)."""
    if not a.hybrid_layer_pattern:
        return None
    p = parse_pattern(a.hybrid_layer_pattern)
    kinds = set(p.kinds) | set(p.mtp_kinds)
    for kind, problem in (("mamba", _mamba_problem), ("gdn", _gdn_problem)):
        found = problem(a, tp, cp) if kind in kinds else None
        if found:
            return found
    return None


def check_split(a: Architecture) -> None:
    """UserError naming tp or cp where the stack's mixers do not split over them."""
    found = split_problem(a, a.tp, a.cp)
    if found:
        field, message = found
        raise UserError(field, message, "choose tp and cp dividing the mixers' heads "
                        "and groups as the message says")


def cp_exchange(a: Architecture, kind: str) -> Exchange:
    """The all-to-alls' widths for a mixer of `kind` ("mamba" or "gdn") on one tensor-
    parallel rank of `a`."""
    if kind == "gdn":
        d = delta_shape(a)
        return Exchange(before=d.in_proj // a.tp, after=d.value // a.tp)
    m = mamba_shape(a)
    local = max(1, m.groups // a.tp)  # check_split refuses groups that tp does not divide
    repeat = a.cp // local if local < a.cp else 1
    return Exchange(before=m.in_proj // a.tp + 2 * local * m.state * (repeat - 1),
                    after=m.inner // a.tp)
