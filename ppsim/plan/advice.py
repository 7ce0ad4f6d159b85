"""What to tell a user when no split fits memory (the `plan` command and the TUI say
the same): the lowest peak any split reaches, on which rank, and what to try."""

from __future__ import annotations

import math

from ppsim.plan.planner import PlanResult


def no_fit_message(res: PlanResult) -> str:
    """One line: why no split fits (or none was found in the budget) and what to try."""
    p = res.problem
    peak, rank = res.smallest_peak or (0, 0)
    tips = [f"more pipeline stages (--pp {p.schedule.pp * 2})",
            "activation recompute (--recompute selective or full)",
            "a smaller micro-batch or fewer microbatches in flight"]
    limit = p.hardware.memory_bytes
    if peak <= limit or math.isfinite(res.lower_bound_ms):
        # The search stopped at its budget: a split may fit that it did not reach.
        return (f"no split that fits {limit / 1e9:.1f} GB per rank was found within the time "
                f"budget (the lowest peak seen is {peak / 1e9:.2f} GB on rank {rank}); give "
                "more --time-budget, or try " + ", ".join(tips))
    return (f"no split fits {limit / 1e9:.1f} GB per rank: the smallest "
            f"peak any split reaches is {peak / 1e9:.2f} GB on rank {rank}; try "
            + ", ".join(tips))

