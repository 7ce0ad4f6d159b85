"""Which shapes the job search plans the splits of.

First the k fastest at their default split that fit, shapes tied there (the same work a
rank: cp 1 and cp 2 at half the micro-batch, say) counted once, so ties do not crowd out
the next distinct shapes, and faster ones that do not fit (an uneven split may fit).
Then, with what the budget leaves, long shots: up to k more groups that fit whose
default split an uneven one that fits might make faster than the best planned
(reachable_ms), most promising first; a shape whose even split overloads one rank (a
heavy head on the last) ranks low at its default split yet may plan fastest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ppsim.costs.model import least_busy_ms, stage_busy_ms
from ppsim.plan.bounds import least_largest_fitting_run
from ppsim.plan.floor import floor_held


def tie_key(r: Any) -> tuple[float, int]:
    """What two shapes tied at their default split share: the iteration time (to a part
    in 10^9) and the peak memory."""
    t = r.summary.iteration_time_ms
    return float(f"{t:.9g}"), getattr(r.summary, "peak_memory_bytes", 0)


def launch_order(r: Any) -> tuple[float, ...]:
    """Fastest first (tie_key), and of tied shapes the simplest to launch: the fewest
    context-parallel ranks (cp 1 at a micro-batch of 1 before cp 4 at 4: the same work a
    rank, without the ring), then tensor, pipeline and expert ranks, virtual stages and
    sequences a microbatch. Float noise decided it."""
    s = r.shape
    return (*tie_key(r), s.cp, s.tp, s.pp, s.ep, s.vpp, s.mbs)


def reachable_ms(r: Any) -> float:
    """What planning the split of the shape simulated in `r` (a ShapeResult) might reach:
    with one chunk a rank, its default split's time less, every microbatch, what its
    busiest rank's pieces (F + B: the embedding, layers, head) exceed the least largest
    run of a contiguous split of them over the ranks that fits memory as the memory
    floor counts it (each rank's weights and state, and its pieces' activations times
    the microbatches it holds at once: ppsim.plan.floor); with several chunks a rank, or
    where no such split fits, its default time. An estimate to rank shapes by: the
    bubble and the memory the floor does not count may keep a plan from it, so it is not
    a bound."""
    e = evening(r.problem, r.shape.pp)
    t = r.summary.iteration_time_ms
    if e.even_ms is None:
        return t
    return t - r.shape.microbatches * max(0.0, e.busiest_ms - e.even_ms)


def least_reach_ms(problem: Any, pp: int, microbatches: int) -> float:
    """What reachable_ms of `problem` (a shape's default split) is at the least, before it
    is simulated: every microbatch, the least of its busiest rank's pieces and the even
    run, as no schedule runs the default split faster than its busiest rank (the walk's
    bound, Pending.bound_ms)."""
    e = evening(problem, pp)
    return microbatches * min(e.busiest_ms, math.inf if e.even_ms is None else e.even_ms)


@dataclass(frozen=True)
class Evening:
    """What evening out a default split's busiest rank could take off a microbatch."""

    busiest_ms: float
    """F + B of its busiest stage's pieces."""
    even_ms: float | None
    """The least largest run of a contiguous split of the pieces that fits memory as the
    floor counts it; None with several chunks a rank, or where no such split fits."""


def evening(problem: Any, pp: int) -> Evening:
    """The busiest stage of `problem`'s split and the even run it might come down to
    (reachable_ms)."""
    split, costs = problem.split, problem.costs
    busiest = max(stage_busy_ms(costs, split))
    if split.num_stages != pp:
        return Evening(busiest_ms=busiest, even_ms=None)
    pieces = [costs.embedding, *costs.layers, costs.head]
    even = least_largest_fitting_run([least_busy_ms(c) for c in pieces],
                                     [(c.static_bytes, c.activation_bytes) for c in pieces],
                                     floor_held(problem), problem.hardware.memory_bytes)
    return Evening(busiest_ms=busiest, even_ms=even)


def shapes_to_plan(results: list[Any], k: int, ties: bool = True) -> list[Any]:
    """The shapes whose splits get planned, fastest first: those of the k fastest tie
    groups that fit at their default split, and faster ones that do not, 2k groups in all
    at the most; without `ties` (each shape planned on its own, as a memory policy search
    plans them) every shape is a group of its own."""
    by_time = sorted(range(len(results)), key=lambda i: results[i].summary.iteration_time_ms)
    key = (lambda i: tie_key(results[i])) if ties else (lambda i: i)
    fitting = _first_groups([i for i in by_time if results[i].summary.fits], k, key)
    groups = len({key(i) for i in fitting})
    slowest = (results[fitting[-1]].summary.iteration_time_ms if groups == k
               else float("inf"))
    over = [i for i in by_time if not results[i].summary.fits
            and results[i].summary.iteration_time_ms < slowest][:2 * k - groups]
    return [results[i] for i in sorted(fitting + over, key=by_time.index)]


def _first_groups(ordered: list[Any], k: int, key: Callable[[Any], Any]) -> list[Any]:
    """The items of `ordered`, in order, whose `key` is one of the first k distinct."""
    groups: list[Any] = []
    out = []
    for item in ordered:
        g = key(item)
        if g not in groups:
            if len(groups) == k:
                break
            groups.append(g)
        out.append(item)
    return out


def long_shots(results: list[Any], planned: list[Any], best_ms: float, k: int,
               ties: bool = True,
               reach: Callable[[Any], float] = reachable_ms) -> list[Any]:
    """The shapes beyond `planned` worth planning too, most promising first: those that
    promise to beat `best_ms` (the best planned time), k groups at the most (tie groups,
    as in shapes_to_plan)."""
    done = {id(r) for r in planned}
    shots = [r for r in results if id(r) not in done and promises(r, best_ms, reach)]
    return _first_groups(sorted(shots, key=reach), k, tie_key if ties else id)


def promises(r: Any, best_ms: float, reach: Callable[[Any], float] = reachable_ms) -> bool:
    """The shape simulated in `r` is a long shot against `best_ms`: it fits at its default
    split and its `reach` is below (long_shots plans the most promising of these)."""
    return bool(r.summary.fits) and reach(r) < best_ms
