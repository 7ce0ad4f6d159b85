"""Which shapes the job search plans the splits of: the k most promising that fit at
their default split, ranked by what planning their split might reach (reachable_ms: the
default split's time less what evening out its busiest rank could take off), shapes tied
at their default split (the same work a rank: cp 1 and cp 2 at half the micro-batch,
say) counted once, so ties do not crowd out the next distinct shapes; always the fastest
at its default split; and more promising ones that do not fit (an uneven split may fit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppsim.costs.model import least_busy_ms
from ppsim.plan.bounds import least_largest_run


def tie_key(r: Any) -> tuple[float, int]:
    """What two shapes tied at their default split share: the iteration time (to a part
    in 10^9) and the peak memory."""
    t = r.summary.iteration_time_ms
    return float(f"{t:.9g}"), getattr(r.summary, "peak_memory_bytes", 0)


def default_ms(r: Any) -> float:
    """A shape's time at its default split."""
    return float(r.summary.iteration_time_ms)


def reachable_ms(r: Any) -> float:
    """What planning the split of the shape simulated in `r` (a ShapeResult) might reach:
    with one chunk a rank, its default split's time less, every microbatch, what its
    busiest rank's pieces (F + B: the embedding, layers, head) exceed the least largest
    run any contiguous split of them over the ranks could have; with several chunks a
    rank, its default time. An estimate to rank shapes by: memory and the bubble may keep
    a plan from it, so it is not a bound."""
    split, costs = r.problem.split, r.problem.costs
    if split.num_stages != r.shape.pp:
        return default_ms(r)
    layers = [least_busy_ms(c) for c in costs.layers]
    embedding, head = least_busy_ms(costs.embedding), least_busy_ms(costs.head)
    busiest = max(sum(layers[st.offset:st.offset + st.layers])
                  + embedding * st.has_embedding + head * st.has_head
                  for st in split.stages)
    even = least_largest_run([embedding, *layers, head], r.shape.pp)
    return default_ms(r) - r.shape.microbatches * max(0.0, busiest - even)


def shapes_to_plan(results: list[Any], k: int, ties: bool = True,
                   reach: Callable[[Any], float] = default_ms) -> list[Any]:
    """The shapes whose splits get planned, most promising first by `reach`: those of the
    k tie groups that fit at their default split and rank first, the fastest at its
    default split too, and more promising ones that do not fit, 2k groups in all at the
    most; without `ties` (each shape planned on its own, as a memory policy search plans
    them) every shape is a group of its own."""
    score = [reach(r) for r in results]
    order = sorted(range(len(results)), key=lambda i: score[i])
    fitting = [i for i in order if results[i].summary.fits]
    key = (lambda i: tie_key(results[i])) if ties else (lambda i: i)
    groups = list(dict.fromkeys(key(i) for i in fitting))[:k]
    if fitting:
        fastest = key(min(fitting, key=lambda i: default_ms(results[i])))
        groups += [fastest] * (fastest not in groups)
    chosen = [i for i in fitting if key(i) in groups]
    slowest = max((score[i] for i in chosen), default=float("inf")) \
        if len(groups) >= k else float("inf")
    over = [i for i in order if not results[i].summary.fits
            and score[i] < slowest][:2 * k - len(groups)]
    return [results[i] for i in sorted(chosen + over, key=order.index)]
