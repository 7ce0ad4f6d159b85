"""Which shapes the job search plans the splits of: the k fastest at their default split
that fit, shapes tied there (the same work a rank: cp 1 and cp 2 at half the micro-batch,
say) counted once, so ties do not crowd out the next distinct shapes, and faster ones
that do not fit (an uneven split may fit).
"""

from __future__ import annotations

from typing import Any


def tie_key(r: Any) -> tuple[float, int]:
    """What two shapes tied at their default split share: the iteration time (to a part
    in 10^9) and the peak memory."""
    t = r.summary.iteration_time_ms
    return float(f"{t:.9g}"), getattr(r.summary, "peak_memory_bytes", 0)


def shapes_to_plan(results: list[Any], k: int, ties: bool = True) -> list[Any]:
    """The shapes whose splits get planned, fastest first: those of the k fastest tie
    groups that fit at their default split, and faster ones that do not, 2k groups in all
    at the most; without `ties` (each shape planned on its own, as a memory policy search
    plans them) every shape is a group of its own."""
    by_time = sorted(range(len(results)), key=lambda i: results[i].summary.iteration_time_ms)
    groups: list[Any] = []
    fitting = []
    for i in by_time:
        if not results[i].summary.fits:
            continue
        key = tie_key(results[i]) if ties else i
        if key not in groups:
            if len(groups) == k:
                break
            groups.append(key)
        fitting.append(i)
    slowest = (results[fitting[-1]].summary.iteration_time_ms if len(groups) == k
               else float("inf"))
    over = [i for i in by_time if not results[i].summary.fits
            and results[i].summary.iteration_time_ms < slowest][:2 * k - len(groups)]
    return [results[i] for i in sorted(fitting + over, key=by_time.index)]
