"""Exact search for the fastest split that fits memory.

Branch and bound over the layer counts of the virtual stages, in stage
order. A valid lower bound on any schedule's iteration time holds for every
rank r: its first op cannot start before microbatch 0's forward has crossed
stages 0..r-1 (head), it is busy m x its stages' work, and after its last
backward the gradient must still cross stages r-1..0 (tail, when the
backward is not split). For one chunk per rank the best bound reachable by
any completion of a prefix is computed exactly by a min-max dynamic
program; with chunks a water-filling relaxation is used. Leaves are timed
by the list-scheduling evaluator, which equals the simulator. A branch is
cut only when its bound is worse than the best found, so the answer is
optimal for the cost model whenever the search finishes; if the time budget
stops it (every phase checks it: the bound's table, the local search, the
search, the last summaries), the smallest open bound is a proven lower bound.
The search keeps its own stack: no recursion depth grows with the stages.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppsim.costs.model import StageCost
from ppsim.pipeline.problem import Problem
from ppsim.pipeline.split import Split, even_counts, split_from_counts
from ppsim.plan.baselines import smallest_peak
from ppsim.plan.bounds import OneChunkBound, PathBounds, WaterFill
from ppsim.plan.floor import MemoryFloor
from ppsim.plan.local import improve
from ppsim.plan.prefix import PrefixTimes
from ppsim.plan.ranking import TIE, Leaders, Rank, empty_stages
from ppsim.plan.search import Deadline, SplitSearch
from ppsim.sim.summary import Summary

__all__ = ["BranchAndBound", "Candidate", "PlanResult", "count_splits", "even_counts",
           "improve", "plan", "smallest_peak"]

INF = math.inf
_EMPTY = StageCost(0.0, 0.0, 0.0, 0, 0, 0, 0)
"""A stage not placed yet, in a lower bound on its rank's memory."""


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


class _Stop(Exception):
    pass


@dataclass
class _Frame:
    """One open node of the search: stages placed so far and its children, best first."""

    costs: list[StageCost]
    counts: list[int]
    pos: int
    children: list[tuple[float, int, StageCost | None, float, int]]
    """(bound, layers on the next stage, its cost, bound of the stages placed, memory)."""
    i: int = 0


@dataclass
class BranchAndBound:
    """Depth-first branch and bound over the stage counts, with an explicit stack."""

    search: SplitSearch
    top_k: int
    progress: Callable[[int, int], None] | None = None
    open_bound: float = INF
    """After a stopped run: no split that fits is faster than this."""

    def __post_init__(self) -> None:
        s = self.search
        self.leaders = Leaders(self.top_k)
        """The best that fit found so far, in the planner's order."""
        self.offered: set[tuple[int, ...]] = set()
        self.paths = PathBounds(s)
        self.prefix_time = PrefixTimes(self.paths)
        self.water = WaterFill(s)
        self.terms = OneChunkBound(s, self.paths) if s.vpp == 1 else None
        self.dp_ready = False
        self.last_stage_of_rank = {max(st): r for r, st in enumerate(s.rank_stages)}
        self.deadline = Deadline(INF)
        self.nodes = 0

    # ------------------------------------------------------------ incumbents

    def offer(self, counts: tuple[int, ...]) -> None:
        if counts in self.offered:
            return
        self.offered.add(counts)
        s = self.search.evaluate(counts)
        if not s.fits:
            return
        self.leaders.add(Rank.of(counts, s.iteration_time_ms, s.peak_memory_bytes))

    def key_of(self, counts: tuple[int, ...]) -> tuple[float, float, float]:
        """(time, empty stages, peak) for the local search; infinite when it does not fit."""
        self.offer(counts)
        s = self.search.evaluate(counts)
        if not s.fits:
            return (INF, INF, INF)
        return (s.iteration_time_ms, empty_stages(counts), s.peak_memory_bytes)

    def ranked(self) -> list[tuple[int, ...]]:
        return self.leaders.ranked()

    def _prunable(self, bound: float, mem: int, counts: list[int], pos: int) -> bool:
        """Cut a branch (stage counts so far, `pos` layers placed) that cannot come
        before the best found: slower, or of equal time (within TIE) with more empty
        stages, or as many and no lower in memory. The optimum stays exact; runners-up
        are the best of the splits the search happened to evaluate."""
        best, s = self.leaders.best, self.search
        # Stages left beyond the layers left stay empty, whatever the completion.
        empty = empty_stages(counts) + max(0, (s.S - len(counts)) - (s.L - pos))
        return best is not None and best.cuts(bound, empty, mem)

    # ------------------------------------------------------------ bounds

    def solve_bound(self, deadline: Deadline) -> None:
        """The exact one-chunk bound's table, if it can be built in time."""
        if self.terms is not None:
            self.dp_ready = self.terms.solve(deadline)

    def _rank_total(self, r: int, costs: list[StageCost], sc: StageCost) -> int:
        """Peak memory of rank r once its last stage (cost sc, after `costs`) is placed."""
        s = self.search
        rc = [costs[i] if i < len(costs) else sc for i in s.rank_stages[r]]
        return sum(c.static_bytes for c in rc) + s.rank_peak(r, rc)

    def _open_rank_over(self, r: int, costs: list[StageCost], sc: StageCost) -> bool:
        """Rank r, its stage len(costs) (cost sc) placed and later ones to come, already
        needs more than the memory: its later stages, counted empty, only add bytes."""
        s = self.search
        k = len(costs)
        rc = [costs[i] if i < k else sc if i == k else _EMPTY for i in s.rank_stages[r]]
        static = sum(c.static_bytes for c in rc)
        if static + s.rank_peak_cap(r, rc) <= s.memory:
            return False  # the quick check: every chunk at its own fullest fits
        return static + s.rank_peak(r, rc) > s.memory

    def _bound_of(self, costs: list[StageCost], k: int, pos: int, base: float) -> float:
        """Lower bound on T for every completion of the first k stages (costs)."""
        if self.dp_ready:
            return max(base, self.terms.value(pos, k))  # type: ignore[union-attr]
        return max(base, self.water.bound(costs, k, self.search.L - pos))

    def _children(self, costs: list[StageCost], counts: list[int], pos: int, base: float,
                  mem: int) -> list[tuple[float, int, StageCost | None, float, int]] | None:
        """The next stage's choices, best bound first; None when the deadline passed."""
        s = self.search
        k = len(counts)
        r = s.sched.stage_rank(k)
        closes = self.last_stage_of_rank.get(k) == r
        cut = self.leaders.best_time * (1 + TIE)
        one = self.terms is not None
        out = []
        for c in range(s.L - pos + 1):
            if self.deadline.passed():
                return None
            # One chunk per rank with the exact table: the stage's cost is never read.
            sc = None if one and self.dp_ready else s.stage(pos, c, k)
            child_mem = mem
            if closes:
                total = (s.one_chunk_total(pos, c, k) if one
                         else self._rank_total(r, costs, sc))  # type: ignore[arg-type]
                if total > s.memory:
                    if c == 0:  # an empty stage holds its whole input (held_input_bytes),
                        continue  # which a first layer's saved bytes may be smaller than
                    break  # from one layer on, more layers only need more memory
                child_mem = max(mem, total)
            elif not one and self._open_rank_over(r, costs, sc):  # type: ignore[arg-type]
                # Every count is checked: a per-stage memory policy may recompute more,
                # and keep less, of a longer stage.
                continue
            nb = base
            if one:  # one chunk per rank: the stage's own term
                nb = max(base, self.terms.term(pos, c, k))  # type: ignore[union-attr]
                if nb > cut:
                    if c == 0 and nb == INF:  # an empty stage that does not fit
                        continue
                    break  # the term only grows with the stage's layers
            elif closes:
                spans, at = {}, 0
                for i, n in enumerate(counts + [c]):
                    spans[i] = (at, n)
                    at += n
                nb = max(base, self.paths.rank_term(r, spans))
            b = self._bound_of(costs + [sc] if not self.dp_ready else costs, k + 1, pos + c,
                               nb)
            if b == INF:
                continue  # no completion fits memory
            out.append((b, c, sc, nb, child_mem))
        out.sort(key=lambda x: (x[0], x[4], -x[1]))
        return out

    def _root(self) -> float:
        return self._bound_of([], 0, 0, 0.0)

    # ------------------------------------------------------------ search

    def run(self, deadline: Deadline) -> bool:
        """Search from the root; True when it finished (all not evaluated was cut)."""
        self.deadline = deadline
        s = self.search
        if s.S == 1:
            self.offer((s.L,))
            return True
        self.open_bound = INF
        first = self._children([], [], 0, 0.0, 0)
        if first is None:
            self.open_bound = self._root()
            return False
        stack = [_Frame([], [], 0, first)]
        try:
            self._descend(stack)
        except _Stop:
            # Open: the child each frame is in (its subtree unfinished) and those after it.
            self.open_bound = min((min((x[0] for x in fr.children[max(fr.i - 1, 0):]),
                                       default=INF) for fr in stack), default=self._root())
            return False
        return True

    def _descend(self, stack: list[_Frame]) -> None:
        s = self.search
        while stack:
            fr = stack[-1]
            if fr.i >= len(fr.children):
                stack.pop()
                continue
            b, c, sc, nb, child_mem = fr.children[fr.i]
            fr.i += 1
            if b > self.leaders.best_time * (1 + TIE):
                fr.i = len(fr.children)  # children are sorted: the rest are worse
                continue
            counts, costs, pos = fr.counts + [c], fr.costs + [sc], fr.pos + c
            if self._prunable(b, child_mem, counts, pos):
                continue
            k = len(counts)
            if not self.deadline.affords(s.eval_s * k / s.S):
                raise _Stop
            if k == s.S - 1:  # one completion left: the rest on the last stage
                rank = s.sched.stage_rank(k)
                total = (s.one_chunk_total(pos, s.L - pos, k) if s.vpp == 1 else
                         self._rank_total(rank, costs, s.stage(pos, s.L - pos, k)))
                if total <= s.memory:
                    self.offer(tuple(counts + [s.L - pos]))
                continue
            # The costlier, much tighter bound: simulate the placed ranks
            # exactly with the rest of the pipeline as a free delay.
            nb = max(nb, self.prefix_time(counts))
            if self._prunable(nb, child_mem, counts, pos):
                continue
            if s.vpp > 1 and s.floors.completion(costs, pos) > s.memory:
                continue  # no completion fits: the ranks left cannot hold what is left
            self.nodes += 1
            if self.progress is not None and self.nodes % 256 == 0:
                self.progress(s.evaluated, 0)
            kids = self._children(costs, counts, pos, nb, child_mem)
            if kids is None:
                raise _Stop
            stack.append(_Frame(costs, counts, pos, kids))


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
