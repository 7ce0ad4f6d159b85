"""The step's data-parallel collectives as they run on the links: each one's time there,
the part no compute hides, and the compute it runs beside (ppsim.job.tail for the DDP
and distributed optimizer's, ppsim.job.fsdp for FSDP's once a step;
ppsim.job.lanes.step_collective_spans places them on a rank's timeline)."""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.job.collectives import behind_compute_ms, unhidden_ms


@dataclass(frozen=True, kw_only=True)
class StepCollective:
    """One of the step's data-parallel collectives, all its buckets, on the links."""

    what: str
    """"gradient reduce-scatter", "gradient all-reduce" or "parameter all-gather"."""
    total_ms: float
    """Its time on the links."""
    unhidden_ms: float
    """The part of it no compute hides."""
    nbytes: float = 0.0
    """The buffers it moves in all (its gathered buffers, summed over the groups it runs
    on)."""
    beside: str = ""
    """The compute it runs beside: "backward" (the last microbatch's, as its buckets
    fill), "forward" (the first microbatch's, which waits for each bucket), or ""
    (none: it follows the rank's last op)."""


@dataclass(frozen=True, kw_only=True)
class Reduction:
    """The step's data-parallel collectives: what they add to it, and how they run."""

    cost_ms: float
    """Their unhidden parts, and their SMs' share of the compute that hides the rest."""
    on_links: tuple[StepCollective, ...] = ()

    def __add__(self, other: Reduction) -> Reduction:
        return Reduction(cost_ms=self.cost_ms + other.cost_ms,
                         on_links=self.on_links + other.on_links)


NOTHING = Reduction(cost_ms=0.0)


def overlapped(what: str, total: float, floor: float, window: float, overlap: bool,
               share: float, beside: str, nbytes: float = 0.0) -> Reduction:
    """A collective of `total` ms (moving `nbytes`) run beside `window` of compute where
    `overlap`, never exposing less than `floor` (its last bucket); else after the rank's
    last op."""
    if not overlap:
        return Reduction(cost_ms=total, on_links=(
            StepCollective(what=what, total_ms=total, unhidden_ms=total, nbytes=nbytes),))
    return Reduction(cost_ms=behind_compute_ms(total, window, share, floor), on_links=(
        StepCollective(what=what, total_ms=total, beside=beside, nbytes=nbytes,
                       unhidden_ms=unhidden_ms(total, window, floor)),))
