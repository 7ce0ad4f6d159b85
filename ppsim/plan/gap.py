"""Where an unproven chunked plan's gap to its lower bound lies.

With several chunks per rank the planner's bound (ppsim.plan.bounds) counts each
rank's work and the dependency paths through one rank, and pours unplaced work over
the ranks as if layers split into fractions, so it sits near the mean rank's work.
The best split's time is its busiest rank's compute plus that rank's idle time; the
gap between the two splits exactly into three parts, which `plan` prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.sim.summary import Summary


@dataclass(frozen=True, kw_only=True)
class ChunkedGap:
    """The best split's time against the lower bound, in three parts (all ms)."""

    time_ms: float
    """The best split's iteration time."""
    lower_bound_ms: float
    """No split that fits is faster than this."""
    rank: int
    """The best split's busiest rank (most compute)."""
    busy_ms: float
    """That rank's compute time."""
    mean_busy_ms: float
    """Compute time per rank, averaged over the ranks."""

    @property
    def idle_ms(self) -> float:
        """The busiest rank's idle time: the interleaved order's warm-up and cool-down
        (and its waits in between), which no per-rank work bound charges to a split."""
        return self.time_ms - self.busy_ms

    @property
    def imbalance_ms(self) -> float:
        """What the busiest rank computes above the mean: whole layers do not balance
        as the bound's fractional layers do."""
        return self.busy_ms - self.mean_busy_ms

    @property
    def bound_below_mean_ms(self) -> float:
        """How far the bound sits below the mean rank's work (negative: above it, from
        the one-rank paths)."""
        return self.mean_busy_ms - self.lower_bound_ms

    def text(self) -> str:
        """One line: the three parts of the gap, as shares of the best time."""
        t = self.time_ms or 1.0
        return (f"why the gap: the lower bound counts per-rank work and paths through one "
                f"rank, and sits {self.bound_below_mean_ms / t:+.1%} below the mean rank's "
                f"compute ({self.mean_busy_ms:.1f} ms); the best split's busiest rank "
                f"{self.rank} computes {self.imbalance_ms / t:.1%} more than the mean (whole "
                f"layers) and idles {self.idle_ms / t:.1%} of the time ({self.idle_ms:.1f} "
                f"ms: the interleaved order's warm-up and cool-down, which the bound does "
                f"not charge to any split)")


def chunked_gap(best: Summary, lower_bound_ms: float) -> ChunkedGap:
    """The gap of `best` (the planner's best split's summary) to `lower_bound_ms`."""
    busiest = max(best.ranks, key=lambda r: r.busy_ms)
    mean = sum(r.busy_ms for r in best.ranks) / len(best.ranks)
    return ChunkedGap(time_ms=best.iteration_time_ms, lower_bound_ms=lower_bound_ms,
                      rank=busiest.rank, busy_ms=busiest.busy_ms, mean_busy_ms=mean)
