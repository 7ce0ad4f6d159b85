"""The split planner: the fastest split that fits memory, within a time budget.

Seeds and a local search give the exact search (ppsim.plan.branch) a good incumbent;
on a hard instance the best found is perturbed and searched again. The answer is
optimal for the cost model whenever the search finishes; otherwise the smallest open
bound is a proven lower bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppsim.pipeline.problem import Problem
from ppsim.pipeline.split import Split, even_counts, split_from_counts
from ppsim.plan.baselines import smallest_peak
from ppsim.plan.branch import BranchAndBound
from ppsim.plan.floor import MemoryFloor
from ppsim.plan.local import improve
from ppsim.plan.ranking import Rank
from ppsim.plan.search import Deadline, SplitSearch
from ppsim.sim.summary import Summary

__all__ = ["Candidate", "PlanResult", "count_splits", "even_counts",
           "improve", "plan", "smallest_peak"]

INF = math.inf


@dataclass(frozen=True)
class Candidate:
    split: Split
    summary: Summary

    @property
    def key(self) -> tuple[float, int]:
        """Faster first, then lower peak memory."""
        return (self.summary.iteration_time_ms, self.summary.peak_memory_bytes)

    @property
    def rank(self) -> Rank:
        """The planner's order (ppsim.plan.ranking): fewer empty stages among equal times."""
        return Rank.of(self.split.counts, self.summary.iteration_time_ms,
                       self.summary.peak_memory_bytes)


@dataclass(frozen=True)
class PlanResult:
    problem: Problem
    best: Candidate | None
    """Fastest split that fits memory (None when none fits)."""
    candidates: list[Candidate]
    """Top K that fit, best first."""
    baseline: Candidate | None
    """Megatron's even split (as even as possible when the layers don't divide); the
    frameworks' own splits are ppsim.plan.references.framework_baselines'."""
    proven_optimal: bool
    lower_bound_ms: float
    """No split that fits is faster than this."""
    evaluated: int
    total_splits: int
    smallest_peak: tuple[int, int] | None
    """(bytes, rank): the lowest max-rank peak memory any split reaches, when none fits."""
    seconds: float
    floor: MemoryFloor | None = None
    """What the fullest rank holds at the least under any split; above the memory
    limit, no split fits and none is searched."""


def count_splits(layers: int, stages: int) -> int:
    """Splits of `layers` into `stages` ordered counts >= 0."""
    return math.comb(layers + stages - 1, stages - 1)


def _even(search: SplitSearch) -> tuple[int, ...]:
    """The baseline: the even split `ppsim split` and the TUI show for this shape."""
    return even_counts(search.L, search.pp, search.vpp, search.problem.split.mtp)


BOUND_SHARE = 0.4
"""Of the budget, what the bound's table (and the local search after it) may take at the
most; the search has until 70 %, then perturbs and searches again until 90 %."""


def plan(problem: Problem, top_k: int = 5, progress: Callable[[int, int], None] | None = None,
         time_budget_s: float = 60.0, seeds: Sequence[tuple[int, ...]] = (),
         started: float | None = None) -> PlanResult:
    """Search all splits of `problem` for the fastest that fits memory, within the budget:
    seeds -> search -> perturb -> search -> result.

    `seeds` (e.g. published splits) start the search, so the answer is never slower
    than any of them, proven or not. The budget runs from `started` (a
    time.perf_counter() value; default: now), so a caller can count the work it did
    before, such as building the problem.
    """
    t0 = time.perf_counter() if started is None else started

    def at(fraction: float) -> float:
        return t0 + fraction * time_budget_s

    search = SplitSearch(problem)
    if search.floor.peak_bytes > search.memory:
        return _floor_over_limit(search, t0)
    bb = BranchAndBound(search, top_k, progress)
    step = lambda: search.eval_s  # noqa: E731 - what one more evaluation costs
    # Starts give the threshold a good start: the even split, the caller's seeds (each
    # timed, whatever the budget: the answer is never slower) and the bound's own pick.
    starts = [_even(search), *seeds]
    for counts in starts:
        bb.key_of(tuple(counts))
    # The table before the search: without its start a search seldom finishes, so even a
    # short budget gives it room first. The local search then has until a quarter of the
    # budget, and at least a twentieth of it after the table.
    bb.solve_bound(Deadline(at(BOUND_SHARE)))
    if bb.dp_ready:
        starts.append(bb.terms.argmin())  # type: ignore[union-attr]
    local_until = min(at(BOUND_SHARE), max(at(0.25), time.perf_counter()
                                           + 0.05 * time_budget_s))
    local = [improve(bb.key_of, tuple(seed), local_until, step_s=step)
             for seed in starts if seed]
    finished = bb.run(Deadline(at(0.7)))
    if not finished:
        # A hard instance: a better incumbent cuts more, so perturb the best
        # split found for a while, then search again from the root.
        best_counts = min(local, key=bb.key_of, default=None)
        if bb.leaders.best is not None:
            best_counts = bb.ranked()[0]
        if best_counts is not None:
            improve(bb.key_of, best_counts, at(0.8), perturb=True, step_s=step)
        finished = bb.run(Deadline(at(0.9)))
    # The rest of the budget (less a margin for the caller's output) for the summaries.
    return _result(bb, finished, t0, Deadline(at(0.97)))


def _result(bb: BranchAndBound, finished: bool, t0: float, deadline: Deadline) -> PlanResult:
    """The answer from what the search found; extras only while the budget lasts."""
    search = bb.search
    cands = [_candidate(search, cs) for cs in bb.ranked()]
    best = cands[0] if cands else None
    if best is not None:
        lower = min(best.summary.iteration_time_ms, bb.open_bound)
    else:
        lower = bb.open_bound if not finished else INF
    if bb.progress is not None:
        bb.progress(search.evaluated, search.evaluated)
    baseline = _candidate(search, _even(search))
    peak = None if best else smallest_peak(search, Deadline(min(deadline.at,
                                                                 time.perf_counter() + 5.0)))
    return PlanResult(search.problem, best, cands, baseline, finished and best is not None,
                      lower, search.evaluated, count_splits(search.L, search.S), peak,
                      time.perf_counter() - t0, search.floor)


def _floor_over_limit(search: SplitSearch, t0: float) -> PlanResult:
    """No split fits, proven without a search: the least the fullest rank holds passes
    the limit. The lowest peak is exact where one chunk a rank makes it quick, else the
    even split's."""
    baseline = _candidate(search, _even(search))
    quick = Deadline(time.perf_counter() + (5.0 if search.vpp == 1 else 0.0))
    return PlanResult(search.problem, None, [], baseline, False, INF, search.evaluated,
                      count_splits(search.L, search.S), smallest_peak(search, quick),
                      time.perf_counter() - t0, search.floor)


def _candidate(search: SplitSearch, counts: tuple[int, ...]) -> Candidate:
    return Candidate(split_from_counts(counts, search.pp, search.vpp, search.L,
                                       search.sched.placement, search.costs.mtp_layers),
                     search.evaluate(counts))
