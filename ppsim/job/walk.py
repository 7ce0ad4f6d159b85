"""The job search's walk: the shapes in order of their bounds, each simulated at its
default split until the bound or the budget ends the walk (ppsim.job.search), passing
over a shape no split could fit (ppsim.plan.floor); then, once the top shapes are
planned, the long shot candidates among those the bound left (bounded_out_shots)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ppsim.job.choice import least_reach_ms, promises, tie_key
from ppsim.job.exposure import exposed_comm_ms, held_back
from ppsim.job.pending import Pending
from ppsim.job.policy_search import fitting_mode, mode_flags
from ppsim.job.shapes import Shape
from ppsim.job.throughput import Throughput
from ppsim.pipeline.problem import Problem, build_problem
from ppsim.plan.floor import memory_floors
from ppsim.policy.report import host_step_ms
from ppsim.sim.simulate import simulate
from ppsim.sim.summary import Summary


class Bounded(Protocol):
    """A shape with its bounds: a Pending, or what a pricing worker sent back of one
    (ppsim.job.pricing.Priced)."""

    @property
    def shape(self) -> Shape: ...

    @property
    def bound_ms(self) -> float: ...

    @property
    def least_ms(self) -> float: ...


Progress = Callable[[str, int, int], None]
"""Told (what, done, total) before each step: a shape simulated, a top shape planned."""


def silent(what: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True, kw_only=True)
class ShapeResult:
    """A shape simulated."""

    shape: Shape
    problem: Problem
    """What was simulated (its split: the default, or the planned one)."""
    summary: Summary
    throughput: Throughput | None
    """None for a uniform model."""
    comm_ms: float
    """Exposed communication on the busiest rank: layer collectives and the DP step."""
    held_back_by: str
    """What cost this candidate most: memory, bubble or exposed communication."""
    planned: bool = False
    """Its split was planned (else the default split was timed)."""
    split_proven: bool = False
    """The split planner proved its split the fastest of the shape's (the cost model's);
    False where it stopped at its time budget, or did not run."""
    policy: str = ""
    """The memory policy the search chose ("full", "layernorm N=2", ...); "" when the
    configured one was kept (no policy search)."""
    policy_flags: str | None = None
    """Megatron's flags for that policy ("" when none are needed); None without a policy
    search, or when Megatron cannot say the policy."""
    long_shot: bool = False
    """Planned as a long shot (ppsim.job.choice.long_shots): not among the fastest at its
    default split, but an uneven one might make it faster than the best of those."""


def shape_result(s: Shape, problem: Problem, summary: Summary, planned: bool = False,
                 policy: str = "", policy_flags: str | None = None) -> ShapeResult:
    """`s` simulated as `problem`: its throughput, exposed communication and what held
    it back."""
    job = problem.hardware.job
    comm = exposed_comm_ms(problem, summary)
    return ShapeResult(shape=s, problem=problem, summary=summary,
                       throughput=job.throughput(summary.iteration_time_ms) if job else None,
                       comm_ms=comm, held_back_by=held_back(summary, comm,
                                                            problem.hardware.memory_bytes,
                                                            host_step_ms(problem)),
                       planned=planned, policy=policy, policy_flags=policy_flags,
                       split_proven=problem.split.num_stages == 1)  # its only split


def _timed(p: Pending, policy: str, problem: Problem) -> ShapeResult:
    """The shape's default split (`problem`) simulated; with a policy search, at the
    first global recompute mode that fits when the configured one does not."""
    summary = simulate(problem, record=False).summary
    if not policy:
        return shape_result(p.shape, problem, summary)
    fit = fitting_mode(p.cfg) if not summary.fits else None
    if fit is not None:
        return shape_result(p.shape, fit.problem, fit.summary, policy=fit.mode,
                            policy_flags=mode_flags(fit.problem, fit.mode))
    mode = p.cfg.model.recompute or "none"
    return shape_result(p.shape, problem, summary, policy=mode,
                        policy_flags=mode_flags(problem, mode))


def _kth_fastest(results: list[ShapeResult], k: int) -> float:
    fast = sorted(r.summary.iteration_time_ms for r in results if r.summary.fits)
    return fast[k - 1] if len(fast) >= k else float("inf")


@dataclass(frozen=True, kw_only=True)
class Floored:
    """A shape whose memory floor is over the limit: no split of it fits."""

    pending: Pending
    problem: Problem
    """Its default split, built."""
    peak_bytes: int
    """The least its fullest rank holds under any split (MemoryFloor.peak_bytes)."""


@dataclass(frozen=True, kw_only=True)
class Simulated:
    """What the search simulated at the shapes' default splits."""

    results: list[ShapeResult]
    over_floor: int
    """Shapes passed over: no split of them fits (Floored)."""
    complete: bool
    """The bound, not the budget, ended the walk."""
    reached: int = 0
    """The shapes the walk reached, in order (the rest the bound or the budget left)."""


def simulate_shapes(pending: Sequence[Bounded], whole: Callable[[Bounded], Pending],
                    policy: str, k: int, budget_s: float, t0: float,
                    progress: Progress) -> Simulated:
    """The shapes in order of their bounds, each made `whole` (its config and costs) and
    simulated at its default split, until one's bound is no faster than the k-th fastest
    that fits, or 0.7 of the budget is spent (after one shape at least). Without a memory
    policy search a shape that no split could fit (its memory floor) is passed over; when
    every shape reached is, the one nearest to fitting is simulated, so the table shows
    what it holds."""
    results: list[ShapeResult] = []
    floored: list[Floored] = []
    complete = True
    reached = 0
    for p in pending:
        if p.bound_ms >= _kth_fastest(results, k):
            break
        if (results or floored) and time.perf_counter() - t0 > budget_s * 0.7:
            complete = False
            break
        # The total is every shape: those the bound rules out are never simulated.
        progress("simulating shapes", len(results) + len(floored), len(pending))
        reached += 1
        full = whole(p)
        problem = build_problem(full.cfg, full.costs)
        least = 0 if policy else memory_floors(problem).floor.peak_bytes
        if least > problem.hardware.memory_bytes:
            floored.append(Floored(pending=full, problem=problem, peak_bytes=least))
            continue
        results.append(_timed(full, policy, problem))
    if not results and floored:
        near = min(floored, key=lambda f: f.peak_bytes)
        results.append(_timed(near.pending, policy, near.problem))
        floored.remove(near)
    return Simulated(results=results, over_floor=len(floored), complete=complete,
                     reached=reached)


def bounded_out_shots(left: Sequence[Bounded], whole: Callable[[Bounded], Pending],
                      best_ms: float, k: int, policy: str, ties: bool, deadline: float,
                      progress: Progress) -> list[ShapeResult]:
    """The shapes the walk's bound `left` unsimulated whose split-free bound
    (Pending.least_ms) is below `best_ms`, the best planned time, simulated at their
    default split, lowest bound first, until k tie groups (each shape its own without
    `ties`) among them promise to beat it (ppsim.job.choice.promises) or `deadline`
    (perf_counter seconds): long shot candidates (an uneven split may lift a shape whose
    default one overloads a rank with the head or the embedding). The bound ignores
    memory, so the lowest are often shapes that do not fit at their default split and
    promise nothing; they do not use up the k, and those whose reach is bounded above the
    best before they are simulated (least_reach_ms) are passed over."""
    promising = sorted((p for p in left if p.least_ms < best_ms), key=lambda p: p.least_ms)
    out: list[ShapeResult] = []
    shots: set[object] = set()
    for i, p in enumerate(promising):
        if len(shots) >= k or time.perf_counter() > deadline:
            break
        progress("simulating bounded-out long shots", i, len(promising))
        full = whole(p)
        # The reach cannot come under the best: not worth simulating. (A memory policy
        # search may time another recompute mode, whose reach this does not bound.)
        if not policy and least_reach_ms(build_problem(full.cfg, full.costs), p.shape.pp,
                                         p.shape.microbatches) >= best_ms:
            continue
        # one shape at a time, under the walk's own memory floor (one = the walk's k)
        got = simulate_shapes([full], lambda q: q, policy, 1, 0.0, time.perf_counter(),
                              silent).results
        out += got
        shots |= {tie_key(r) if ties else id(r) for r in got if promises(r, best_ms)}
    return out
