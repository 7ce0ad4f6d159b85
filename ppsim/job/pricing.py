"""Every shape of a job search priced before any is simulated: its bound and the bytes
that rule it out (ppsim.job.pending), in this process or, for a large search on a
machine with cores to spare, spread over worker processes.

What a worker sends back is small (Priced): the bound and bytes, not the shape's config
and costs, which the search rebuilds for the few shapes it goes on to simulate (priced
here, a shape keeps them: Pending). The numbers are the same in any process, so a
search finds the same answer however many workers priced it.

Pricing stops at the search's deadline (after its first step, so a search always has
shapes to walk). The shapes are priced in an order that reaches every (tp, cp, pp) of the
grid early (`spread`), so a pricing cut short leaves a sample of the whole grid rather than
its smallest tensor-parallel sizes; what is priced comes back in the order given.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from ppsim.errors import UserError
from ppsim.job.pending import Pending, pending_shape
from ppsim.job.shapes import Shape

PARALLEL_SHAPES = 4000
"""The fewest shapes a search prices in worker processes: fewer take this process a few
seconds (about 1 ms a shape), which workers that start in a second or two (each
importing ppsim, its caches cold) would barely shorten."""
CHUNKS_PER_WORKER = 8
"""Tasks per worker: the progress moves, and a deadline can stop pricing, as each ends
(a worker's caches serve all its tasks)."""


@dataclass(frozen=True, kw_only=True)
class Priced:
    """A shape's bound and bytes (Pending's, without its config and costs)."""

    shape: Shape
    bound_ms: float
    """Pending.bound_ms."""
    least_ms: float
    """Pending.least_ms."""
    static_bytes: int
    """Pending.static_bytes."""
    host_bytes: float
    """Pending.host_bytes."""
    overflows: bool
    """Pending.overflows."""


@dataclass(frozen=True, kw_only=True)
class Pricing:
    """The shapes priced, in the order given."""

    priced: list[Pending | Priced]
    """Those the model accepts: whole where priced here, as sent where in a worker."""
    refusals: list[UserError]
    """Those it refuses, with Megatron's (or a limit's) reason."""
    complete: bool = True
    """Every shape was priced before the deadline."""


def priced(p: Pending | Priced) -> Priced:
    """What a worker sends back of `p`."""
    if isinstance(p, Priced):
        return p
    return Priced(shape=p.shape, bound_ms=p.bound_ms, least_ms=p.least_ms,
                  static_bytes=p.static_bytes,
                  host_bytes=p.host_bytes, overflows=p.overflows)


Refusal = tuple[str, str, str]
"""A UserError's field, problem and fix (an exception with its own __init__ does not
pickle back whole)."""


def _price(cfg: Any, shapes: Sequence[Shape], gbs: int) -> list[Pending | Refusal]:
    out: list[Pending | Refusal] = []
    for s in shapes:
        try:
            out.append(pending_shape(cfg, s, gbs))
        except UserError as e:
            out.append((e.field, e.problem, e.fix))
    return out


def _price_to_send(cfg: Any, shapes: Sequence[Shape], gbs: int) -> list[Priced | Refusal]:
    """_price in a worker: each shape as sent back."""
    return [r if isinstance(r, tuple) else priced(r) for r in _price(cfg, shapes, gbs)]


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def spread(todo: Sequence[Shape]) -> list[int]:
    """Indices of `todo` taking each (tp, cp, pp) in turn: the first shape of each, then
    the second of each, and so on (within one, as given)."""
    groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(todo):
        groups[s.tp, s.cp, s.pp].append(i)
    rounds = max((len(g) for g in groups.values()), default=0)
    return [g[j] for j in range(rounds) for g in groups.values() if j < len(g)]


def price_shapes(cfg: Any, todo: Sequence[Shape], gbs: int,
                 progress: Callable[[str, int, int], None],
                 workers: int | None = None, deadline: float = math.inf) -> Pricing:
    """Each shape of `todo` priced (pending_shape), in `spread` order until `deadline`
    (perf_counter seconds; at least one step); over `workers` processes (default: the
    usable cores) when there are PARALLEL_SHAPES or more and more than one worker."""
    n = usable_cores() if workers is None else workers
    order = spread(todo)
    shapes = [todo[i] for i in order]
    results: Sequence[Pending | Priced | Refusal] | None = None
    if n >= 2 and len(todo) >= PARALLEL_SHAPES:
        results = _price_apart(cfg, shapes, gbs, progress, n, deadline)
    if results is None:
        here: list[Pending | Refusal] = []
        step = max(1, len(todo) // 100)
        for i in range(0, len(todo), step):
            if i and time.perf_counter() > deadline:
                break
            progress("pricing shapes", i, len(todo))
            here += _price(cfg, shapes[i:i + step], gbs)
        results = here
    # in the order given (a pricing cut short: the first of `order`)
    kept = sorted(zip(order[:len(results)], results, strict=True), key=lambda p: p[0])
    return Pricing(priced=[r for _, r in kept if not isinstance(r, tuple)],
                   refusals=[UserError(*r) for _, r in kept if isinstance(r, tuple)],
                   complete=len(results) == len(todo))


def _price_apart(cfg: Any, todo: Sequence[Shape], gbs: int,
                 progress: Callable[[str, int, int], None],
                 workers: int, deadline: float) -> list[Priced | Refusal] | None:
    """_price_to_send over `workers` spawned processes, consecutive shapes in one task,
    the tasks' results in order until `deadline` (at least the first; those not started
    by then are dropped); None where no worker could run (a main module read from stdin
    cannot be spawned again; a container without shared memory has no semaphores): the
    caller prices them itself."""
    size = -(-len(todo) // (workers * CHUNKS_PER_WORKER))
    chunks = [todo[i:i + size] for i in range(0, len(todo), size)]
    results: list[Priced | Refusal] = []
    # spawn, not fork: a fork would copy locks the caller's threads (a progress bar's) hold
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(_price_to_send, cfg, c, gbs) for c in chunks]
            for i, f in enumerate(futures):
                if i and time.perf_counter() > deadline:
                    _stop(pool)
                    break
                progress("pricing shapes", i * size, len(todo))
                results += f.result()
    except (BrokenProcessPool, OSError):
        return None
    return results


def _stop(pool: ProcessPoolExecutor) -> None:
    """End `pool` now: its workers killed, not left to finish the tasks already queued to
    them (a second or more each) on the cores the search goes on with."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # no public handle
    pool.shutdown(wait=False, cancel_futures=True)
    for w in workers:
        w.terminate()
    for w in workers:
        w.join()
