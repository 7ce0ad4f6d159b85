"""Local search over splits: the planner's head start (ppsim.plan.planner). A better
incumbent early cuts more of the branch and bound; optimality still comes from the
search."""

from __future__ import annotations

import random
import time
from collections.abc import Callable


def improve(key_of: Callable[[tuple[int, ...]], tuple[float, ...]], counts: tuple[int, ...],
            until: float, perturb: bool = False,
            step_s: Callable[[], float] = lambda: 0.0) -> tuple[int, ...]:
    """Local search over splits: move one layer between two stages, or swap two
    stages' counts, taking the first change that helps; with `perturb`, restart
    from random nearby splits of the best (iterated local search) until `until`.

    Only a head start for the branch and bound: a better incumbent cuts more;
    optimality still comes from the search. `step_s()` is what one more
    evaluation is expected to take: none starts that would end after `until`.
    """
    rng = random.Random(0)  # deterministic: same answer every run
    S = len(counts)
    best, best_key = counts, key_of(counts)
    current, current_key = best, best_key
    while time.perf_counter() + step_s() < until:
        improved = False
        for a in range(S):
            for b in range(S):
                if a == b:
                    continue
                if time.perf_counter() + step_s() >= until:
                    break
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
            if time.perf_counter() + step_s() >= until:
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
