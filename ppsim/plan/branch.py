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
from collections.abc import Callable
from dataclasses import dataclass

from ppsim.costs.model import StageCost
from ppsim.plan.bounds import OneChunkBound, PathBounds, WaterFill
from ppsim.plan.prefix import PrefixTimes
from ppsim.plan.ranking import TIE, Leaders, Rank, empty_stages
from ppsim.plan.search import Deadline, SplitSearch

__all__ = ["BranchAndBound"]

INF = math.inf
_EMPTY = StageCost(0.0, 0.0, 0.0, 0, 0, 0, 0)
"""A stage not placed yet, in a lower bound on its rank's memory."""


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
