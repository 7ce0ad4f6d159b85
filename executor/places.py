"""Where the routed experts sit among a pipeline rank's tp x dp ranks (Megatron's MoE
parallel folding; under context parallelism each replica's cp ranks count as replicas,
so the places are tp x cp x dp). Place q = d x tp + t is replica d's tensor rank t; in
the expert order q = e + etp x (i + ep x k): expert tensor rank e innermost (etp 1,
each expert whole; etp = tp, the tensor group; else etp consecutive places), expert
rank i, then the experts' replica k."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ExpertPlaces:
    """The expert groups over one pipeline rank's places."""

    tensor_groups: list[list[int]]
    """Places each expert is split over (etp of them), a gather group per list."""
    expert_groups: list[list[int]]
    """Places sharing the routed experts (E / ep each), an all-to-all group per list."""
    replica_groups: list[list[int]]
    """Places holding the same experts (and the same slice of each), over which their
    gradients are reduced."""


@dataclass(frozen=True, kw_only=True)
class ExpertShape:
    """How a model's routed experts are spread: over ep ranks, each split over etp."""

    ep: int = 1
    etp: int = 1

    @classmethod
    def of(cls, a: Any) -> ExpertShape:
        """An Architecture's (1 and 1 for a dense model)."""
        return cls(ep=a.ep, etp=a.expert_tp) if a.num_experts else cls()


def group_of(groups: list[list[int]], place: int) -> int:
    """The index of the group holding `place`."""
    return next(j for j, g in enumerate(groups) if place in g)


def expert_places(tp: int, dp: int, ep: int, etp: int) -> ExpertPlaces:
    """The expert tensor, expert-parallel and replica groups of tp x dp places. Raises
    ValueError where etp x ep does not divide them."""
    if (tp * dp) % (etp * ep):
        raise ValueError(f"etp x ep = {etp * ep} does not divide tp x dp = {tp * dp}")
    copies = tp * dp // (etp * ep)
    return ExpertPlaces(
        tensor_groups=[list(range(j * etp, (j + 1) * etp)) for j in range(tp * dp // etp)],
        expert_groups=[[e + etp * (i + ep * k) for i in range(ep)]
                       for e in range(etp) for k in range(copies)],
        replica_groups=[[e + etp * (i + ep * k) for k in range(copies)]
                        for e in range(etp) for i in range(ep)])
