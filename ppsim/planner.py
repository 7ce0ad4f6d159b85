"""Exact search for the fastest split that fits memory.

Branch and bound over the layer counts of the virtual stages, in stage
order. A valid lower bound on any schedule's iteration time holds for every
rank r: its first op cannot start before microbatch 0's forward has crossed
stages 0..r-1 (head), it is busy m x its stages' work, and after its last
backward the gradient must still cross stages r-1..0 (tail, when the
backward is not split). For one chunk per rank the best bound reachable by
any completion of a prefix is computed exactly by a min-max dynamic
program; with chunks a water-filling relaxation is used. Leaves are timed
by the list-scheduling evaluator, which equals the simpy simulator. A
branch is cut only when its bound is worse than the K-th best found, so
the answer is optimal for the cost model whenever the search finishes; if
a time budget stops it, the smallest open bound is a proven lower bound.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from ppsim.bounds import OneChunkBound, PathBounds, WaterFill, prefix_time
from ppsim.costs import StageCost, stage_cost
from ppsim.evaluate import list_schedule
from ppsim.problem import Problem
from ppsim.schedules import F
from ppsim.split import Split, split_from_counts
from ppsim.timing import Summary, compile_schedule, summarize

INF = math.inf
TIE = 1e-9
"""Iteration times within this relative difference count as equal."""


@dataclass(frozen=True)
class Candidate:
    split: Split
    summary: Summary

    @property
    def key(self) -> tuple[float, int]:
        """Rank order: faster first, then lower peak memory."""
        return (self.summary.iteration_time_ms, self.summary.peak_memory_bytes)


@dataclass(frozen=True)
class PlanResult:
    problem: Problem
    best: Candidate | None
    """Fastest split that fits memory (None when none fits)."""
    candidates: list[Candidate]
    """Top K that fit, best first."""
    baseline: Candidate | None
    """Megatron's even split (as even as possible when the layers don't divide)."""
    deepspeed: Candidate | None
    """DeepSpeed's parameter-balanced split (one chunk per rank only)."""
    proven_optimal: bool
    lower_bound_ms: float
    """No split that fits is faster than this."""
    evaluated: int
    total_splits: int
    smallest_peak: tuple[int, int] | None
    """(bytes, rank): the lowest max-rank peak memory any split reaches, when none fits."""
    seconds: float


def count_splits(layers: int, stages: int) -> int:
    """Splits of `layers` into `stages` ordered counts >= 0."""
    return math.comb(layers + stages - 1, stages - 1)


class SplitSearch:
    """Everything that stays fixed while the split varies, precomputed once."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.costs = problem.costs
        self.sched = problem.schedule
        self.compiled = compile_schedule(problem.schedule)
        self.pp, self.vpp, self.m = self.sched.pp, self.sched.vpp, self.sched.microbatches
        self.S = self.sched.num_stages
        self.L = self.costs.num_layers
        self.memory = problem.hardware.memory_bytes
        self.split_bw = self.sched.split_backward
        self.evaluated = 0
        hidden = self.costs.hidden_bytes
        self.delay = [0.0 if self.sched.stage_rank(s) == self.sched.stage_rank(s + 1)
                      else problem.hardware.transfer_ms(hidden) for s in range(self.S - 1)]
        # Per-op message delays do not depend on the split (hidden size is fixed).
        self.send_delay = [[self.delay[ss] if ss >= 0 else 0.0 for ss in stages]
                           for stages in self.compiled.send_stage]
        self.patterns = [self._memory_pattern(r) for r in range(self.pp)]
        self.rank_stages = [[s for s in range(self.S) if self.sched.stage_rank(s) == r]
                            for r in range(self.pp)]
        self._stage = lru_cache(maxsize=None)(self._stage_cost)
        self._evaluated: dict[tuple[int, ...], Summary] = {}
        self.paths = PathBounds(self)

    # ------------------------------------------------------------ costs

    def _stage_cost(self, offset: int, count: int, index: int) -> StageCost:
        return stage_cost(self.costs, offset, count, index == 0, index == self.S - 1)

    def stage(self, offset: int, count: int, index: int) -> StageCost:
        return self._stage(offset, count, index)

    def work(self, c: StageCost) -> float:
        """Busy time of one microbatch on a stage (F + B + W)."""
        return c.forward_ms + c.backward_ms

    def _memory_pattern(self, r: int) -> list[tuple[int, ...]]:
        """Per-chunk (full, kept) activation counts at every op start on rank r.

        A rank's peak activation bytes is the max over these records of
        sum(full_c * activation_c + kept_c * weight_grad_c), integer-exact.
        """
        chunks = self.vpp
        full = [0] * chunks
        kept = [0] * chunks
        records = set()
        for kind, stage in zip(self.compiled.kind[r], self.compiled.stage[r], strict=True):
            c = stage // self.pp
            if kind == F:
                full[c] += 1
            records.add(tuple(full) + tuple(kept))
            if kind == "B":
                full[c] -= 1
                if self.split_bw:
                    kept[c] += 1
            elif kind == "W":
                kept[c] -= 1
        return sorted(records)

    def rank_peak(self, r: int, costs: list[StageCost]) -> int:
        """Peak activation bytes on rank r given its stages' costs (chunk order)."""
        act = [c.activation_bytes for c in costs]
        keep = [min(c.weight_grad_bytes, c.activation_bytes) if self.split_bw else 0
                for c in costs]
        n = len(costs)
        best = 0
        for rec in self.patterns[r]:
            v = 0
            for i in range(n):
                v += rec[i] * act[i] + rec[n + i] * keep[i]
            if v > best:
                best = v
        return best

    # ------------------------------------------------------------ evaluation

    def stage_costs(self, counts: tuple[int, ...]) -> list[StageCost]:
        out, offset = [], 0
        for i, n in enumerate(counts):
            out.append(self.stage(offset, n, i))
            offset += n
        return out

    def evaluate(self, counts: tuple[int, ...]) -> Summary:
        """Exactly what simulate() reports for this split (tests prove it)."""
        hit = self._evaluated.get(counts)
        if hit is not None:
            return hit
        self.evaluated += 1
        costs = self.stage_costs(counts)
        f = [c.forward_ms for c in costs]
        if self.split_bw:
            b = [c.backward_ms - c.weight_grad_ms for c in costs]
        else:
            b = [c.backward_ms for c in costs]
        w = [c.weight_grad_ms for c in costs]
        by_kind = {"F": f, "B": b, "W": w}
        durations = [[by_kind[k][s] for k, s in zip(kinds, stages, strict=True)]
                     for kinds, stages in zip(self.compiled.kind, self.compiled.stage,
                                              strict=True)]
        _, ends = list_schedule(self.compiled, durations, self.send_delay)
        busy = []
        for durs in durations:
            t = 0.0
            for d in durs:
                t += d
            busy.append(t)
        statics = [0] * self.pp
        peaks = []
        layers = []
        for r in range(self.pp):
            rc = [costs[s] for s in self.rank_stages[r]]
            statics[r] = sum(c.static_bytes for c in rc)
            inflight = max((sum(rec[:self.vpp]) for rec in self.patterns[r]), default=0)
            peaks.append((self.rank_peak(r, rc), inflight))
            layers.append(sum(counts[s] for s in self.rank_stages[r]))
        last = [e[-1] if e else 0.0 for e in ends]
        summary = summarize(statics, last, busy, layers, self.memory, peaks)
        self._evaluated[counts] = summary
        return summary

# ---------------------------------------------------------------- search


class _Stop(Exception):
    pass


def plan(problem: Problem, top_k: int = 5, progress: Callable[[int, int], None] | None = None,
         time_budget_s: float = 60.0, seeds: Sequence[tuple[int, ...]] = ()) -> PlanResult:
    """Search all splits of `problem` for the fastest that fits memory.

    `seeds` (e.g. published splits) start the search, so the answer is never
    slower than any of them, proven or not."""
    t0 = time.perf_counter()
    search = SplitSearch(problem)
    S, L = search.S, search.L
    top: list[tuple[float, int, tuple[int, ...]]] = []  # max-heap via negation

    best_key: list[tuple[float, float]] = [(INF, INF)]

    def threshold() -> tuple[float, float]:
        """Prune against the best found: the optimum is exact; runners-up are the
        best of the splits the search happened to evaluate."""
        return best_key[0]

    offered: set[tuple[int, ...]] = set()

    def offer(counts: tuple[int, ...]) -> None:
        if counts in offered:
            return
        offered.add(counts)
        s = search.evaluate(counts)
        if not s.fits:
            return
        key = (s.iteration_time_ms, s.peak_memory_bytes)
        if key < best_key[0]:
            best_key[0] = key
        item = (-s.iteration_time_ms, -s.peak_memory_bytes, tuple(-c for c in counts))
        if len(top) < top_k:
            heapq.heappush(top, item)
        elif item > top[0]:
            heapq.heapreplace(top, item)

    def rank_total(r: int, costs: list[StageCost]) -> int:
        """Peak memory of rank r once all its stages are placed."""
        rc = [costs[s] for s in search.rank_stages[r]]
        return sum(c.static_bytes for c in rc) + search.rank_peak(r, rc)

    last_stage_of_rank = {max(st): r for r, st in enumerate(search.rank_stages)}
    exact_dp = search.vpp == 1
    paths = search.paths
    total_work = None if exact_dp else WaterFill(search)
    dp = OneChunkBound(search, paths) if exact_dp else None

    # Seeds give the threshold a good start: the even split and the DP's own pick.
    def key_of(counts: tuple[int, ...]) -> tuple[float, float]:
        offer(counts)
        s = search.evaluate(counts)
        return (s.iteration_time_ms, s.peak_memory_bytes) if s.fits else (INF, INF)

    starts = [even_counts(L, S), *seeds]
    if dp is not None:
        starts.append(dp.argmin())
    local = [improve(key_of, seed, t0 + time_budget_s / 4) for seed in starts if seed]

    stack_bounds: list[float] = []  # bounds of open branches, for the proven lower bound
    deadline = t0 + time_budget_s
    nodes = [0]

    def bound_of(costs: list[StageCost], k: int, pos: int, base: float) -> float:
        """Lower bound on T for every completion of the first k stages."""
        if dp is not None:
            return max(base, dp.value(pos, k))
        return max(base, total_work.bound(costs, k, L - pos))  # type: ignore[union-attr]

    def dfs(costs: list[StageCost], counts: list[int], pos: int, base: float,
            mem: int) -> None:
        """base: max stage term placed so far; mem: max peak of the complete ranks."""
        k = len(counts)
        if k == S - 1:
            c = L - pos
            r = search.sched.stage_rank(k)
            if rank_total(r, costs + [search.stage(pos, c, k)]) <= search.memory:
                offer(tuple(counts + [c]))
            return
        nodes[0] += 1
        if progress is not None and nodes[0] % 256 == 0:
            progress(search.evaluated, 0)
        if time.perf_counter() > deadline:
            open_bound[0] = min(stack_bounds, default=INF)
            raise _Stop
        r = search.sched.stage_rank(k)
        closes_rank = last_stage_of_rank.get(k) == r
        children = []
        for c in range(L - pos + 1):
            new = costs + [search.stage(pos, c, k)]
            child_mem = mem
            if closes_rank:
                total = rank_total(r, new)
                if total > search.memory:
                    break  # more layers only need more memory
                child_mem = max(mem, total)
            nb = base
            if dp is not None:  # one chunk per rank: the stage's own term
                nb = max(base, dp.term(pos, c, k))
            elif closes_rank:
                spans = {}
                at = 0
                for i, n in enumerate(counts + [c]):
                    spans[i] = (at, n)
                    at += n
                nb = max(base, paths.rank_term(r, spans))
            b = bound_of(new, k + 1, pos + c, nb)
            if b == INF:
                continue  # no completion fits memory
            children.append((b, c, new, nb, child_mem))
        children.sort(key=lambda x: (x[0], x[4], -x[1]))
        for i, (b, c, new, nb, child_mem) in enumerate(children):
            th_t, th_mem = threshold()
            # Times within TIE of each other are equal; then lower memory wins.
            if b > th_t * (1 + TIE) or (b >= th_t * (1 - TIE) and child_mem >= th_mem):
                if b > th_t * (1 + TIE):
                    break
                continue
            if k + 1 < S - 1:
                # The costlier, much tighter bound: simulate the placed ranks
                # exactly with the rest of the pipeline as a free delay.
                nb = max(nb, prefix_time(search, counts + [c]))
                if nb > th_t * (1 + TIE) or (nb >= th_t * (1 - TIE) and child_mem >= th_mem):
                    continue
            stack_bounds.append(min(x[0] for x in children[i:]))
            try:
                dfs(new, counts + [c], pos + c, nb, child_mem)
            finally:
                stack_bounds.pop()

    def branch_and_bound(until: float) -> bool:
        """True when the search finished (everything not evaluated was cut)."""
        nonlocal deadline
        deadline = until
        stack_bounds.clear()
        open_bound[0] = INF
        try:
            if S == 1:
                offer((L,))
            else:
                stack_bounds.append(bound_of([], 0, 0, 0.0))  # the root: every split
                dfs([], [], 0, 0.0, 0)
        except _Stop:
            return False
        return True

    open_bound = [INF]
    finished = branch_and_bound(t0 + 0.7 * time_budget_s)
    if not finished:
        # A hard instance: a better incumbent cuts more, so perturb the best
        # split found for a while, then search again from the root.
        best_counts = min(local, key=key_of, default=None)
        if top:
            best_counts = tuple(-c for c in max(top)[2])
        if best_counts is not None:
            improve(key_of, best_counts, t0 + 0.8 * time_budget_s, perturb=True)
        finished = branch_and_bound(t0 + time_budget_s)

    ranked = sorted(((-t, -p, tuple(-c for c in cs)) for t, p, cs in top))
    cands = [_candidate(search, cs) for _, _, cs in ranked]
    best = cands[0] if cands else None
    if best is not None:
        lower = min(best.summary.iteration_time_ms, open_bound[0])
    else:
        lower = open_bound[0] if not finished else INF
    if progress is not None:
        progress(search.evaluated, search.evaluated)
    base = even_counts(L, S)
    baseline = _candidate(search, base) if base else None
    ds = deepspeed_counts(search) if search.vpp == 1 else None
    return PlanResult(problem, best, cands, baseline, _candidate(search, ds) if ds else None,
                      finished and best is not None, lower, search.evaluated,
                      count_splits(L, S), None if best else smallest_peak(search),
                      time.perf_counter() - t0)


def improve(key_of: Callable[[tuple[int, ...]], tuple[float, float]], counts: tuple[int, ...],
            until: float, perturb: bool = False) -> tuple[int, ...]:
    """Local search over splits: move one layer between two stages, or swap two
    stages' counts, taking the first change that helps; with `perturb`, restart
    from random nearby splits of the best (iterated local search) until `until`.

    Only a head start for the branch and bound: a better incumbent cuts more;
    optimality still comes from the search.
    """
    rng = random.Random(0)  # deterministic: same answer every run
    S = len(counts)
    best, best_key = counts, key_of(counts)
    current, current_key = best, best_key
    while time.perf_counter() < until:
        improved = False
        for a in range(S):
            for b in range(S):
                if a == b:
                    continue
                n = list(current)
                if current[a] > 0:
                    n[a] -= 1
                    n[b] += 1
                    k = key_of(tuple(n))
                    if k < current_key:
                        current, current_key, improved = tuple(n), k, True
                        break
                if a < b and current[a] != current[b]:
                    n = list(current)
                    n[a], n[b] = n[b], n[a]
                    k = key_of(tuple(n))
                    if k < current_key:
                        current, current_key, improved = tuple(n), k, True
                        break
            if time.perf_counter() >= until:
                break
        if current_key < best_key:
            best, best_key = current, current_key
        if improved:
            continue
        if not perturb:
            break
        n = list(best)
        for _ in range(rng.randint(2, 4)):
            a, b = rng.randrange(S), rng.randrange(S)
            if n[a] > 0:
                n[a] -= 1
                n[b] += 1
        current, current_key = tuple(n), key_of(tuple(n))
    return best


def _candidate(search: SplitSearch, counts: tuple[int, ...]) -> Candidate:
    return Candidate(split_from_counts(counts, search.pp, search.vpp, search.L,
                                       search.sched.placement, search.costs.mtp_layers),
                     search.evaluate(counts))


def even_counts(layers: int, stages: int) -> tuple[int, ...]:
    """Megatron's even split; with a remainder, the first stages take one more."""
    q, rem = divmod(layers, stages)
    return tuple(q + (1 if i < rem else 0) for i in range(stages))


def deepspeed_counts(search: SplitSearch) -> tuple[int, ...]:
    """DeepSpeed partition_method='parameters': contiguous parts minimising the largest
    parameter (static-byte) sum, with the embedding and head counted as layers."""
    S, L = search.S, search.L

    @cache
    def best(pos: int, k: int) -> tuple[float, tuple[int, ...]]:
        if k == S - 1:
            return (search.stage(pos, L - pos, k).static_bytes, (L - pos,))
        out = (INF, ())
        for c in range(L - pos + 1):
            here = search.stage(pos, c, k).static_bytes
            if here >= out[0]:
                break
            rest, tail = best(pos + c, k + 1)
            v = max(here, rest)
            if v < out[0]:
                out = (v, (c,) + tail)
        return out

    return best(0, 0)[1]


def smallest_peak(search: SplitSearch, budget_s: float = 5.0) -> tuple[int, int]:
    """(bytes, rank): the lowest highest-rank peak memory over all splits.

    Exact min-max dynamic program with one chunk per rank; with chunks a
    branch and bound that stops at the budget (then the best found).
    """
    S, L = search.S, search.L

    def total(r: int, costs: list[StageCost]) -> int:
        rc = [costs[s] for s in search.rank_stages[r]]
        return sum(c.static_bytes for c in rc) + search.rank_peak(r, rc)

    if search.vpp == 1:
        @cache
        def best(pos: int, k: int) -> tuple[float, int]:
            if k == S - 1:
                return (total(k, [search.stage(pos, L - pos, k)] * (k + 1)), k)
            out: tuple[float, int] = (INF, -1)
            for c in range(L - pos + 1):
                here = total(k, [search.stage(pos, c, k)] * (k + 1))
                if here >= out[0]:
                    break
                rest = best(pos + c, k + 1)
                v = max((here, k), rest)
                if v[0] < out[0]:
                    out = v
            return out

        v, r = best(0, 0)
        return int(v), r
    found: list = [INF, -1]
    last_of_rank = {max(st): r for r, st in enumerate(search.rank_stages)}
    deadline = time.perf_counter() + budget_s

    def dfs(costs: list[StageCost], pos: int, cur: tuple[float, int]) -> None:
        k = len(costs)
        if k == S:
            if cur[0] < found[0]:
                found[:] = [cur[0], cur[1]]
            return
        if time.perf_counter() > deadline:
            return
        for c in (range(L - pos + 1) if k < S - 1 else [L - pos]):
            new = costs + [search.stage(pos, c, k)]
            v = cur
            r = last_of_rank.get(k)
            if r is not None:
                v = max(cur, (total(r, new), r))
            if v[0] >= found[0]:
                if r is not None:
                    break
                continue
            dfs(new, pos + c, v)

    dfs([], 0, (0, -1))
    return int(found[0]), found[1]
