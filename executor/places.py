"""Where the routed experts sit among a pipeline rank's tp x dp ranks (Megatron's MoE
parallel folding). Place q = d x tp + t is replica d's tensor rank t; in the expert
order q = e + etp x (i + ep x k): expert tensor rank e innermost (etp 1, each expert
whole; etp = tp, the tensor group), expert rank i, then the experts' replica k."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ExpertPlaces:
    """The expert groups over one pipeline rank's places."""

    expert_groups: list[list[int]]
    """Places sharing the routed experts (E / ep each), an all-to-all group per list."""
    replica_groups: list[list[int]]
    """Places holding the same experts (and the same slice of each), over which their
    gradients are reduced."""

    def of(self, place: int) -> tuple[int, int]:
        """The indexes of `place`'s expert group and replica group."""
        return (next(j for j, g in enumerate(self.expert_groups) if place in g),
                next(j for j, g in enumerate(self.replica_groups) if place in g))


def expert_places(tp: int, dp: int, ep: int, etp: int) -> ExpertPlaces:
    """The expert-parallel groups and the experts' replica groups of tp x dp places.
    Raises ValueError where etp x ep does not divide them or etp is neither 1 nor tp
    (the expert tensor group must be the tensor group or none)."""
    if etp not in (1, tp):
        raise ValueError(f"etp = {etp}: the experts split over all the tensor ranks "
                         f"({tp}) or none")
    if (tp * dp) % (etp * ep):
        raise ValueError(f"etp x ep = {etp * ep} does not divide tp x dp = {tp * dp}")
    copies = tp * dp // (etp * ep)
    return ExpertPlaces(
        expert_groups=[[e + etp * (i + ep * k) for i in range(ep)]
                       for e in range(etp) for k in range(copies)],
        replica_groups=[[e + etp * (i + ep * k) for k in range(copies)]
                        for e in range(etp) for i in range(ep)])
