"""The schedule validator: complete, ordered, deadlock-free.

It keeps one byte per (stage, microbatch, kind) and reads each rank's order as
(kind, stage, microbatch) triples, so a million-action order read from a CSV is checked
in a few MB beside the order itself (issue 27). Where the order is far from complete
(more stages x microbatches than it has actions) only the first `actions + 1` pairs are
indexed: one of them must be missing, and that is the first defect reported.
"""

from __future__ import annotations

from ppsim.errors import UserError
from ppsim.pipeline.messages import source_stage
from ppsim.schedules.actions import KINDS, Action, Schedule, W, dependencies
from ppsim.schedules.packed import rank_triples

Defect = tuple[int, int]
"""(stage * microbatches + microbatch, kind index): the order defects are reported in."""


def validate(schedule: Schedule) -> None:
    """Raise UserError unless the schedule is a complete, valid, deadlock-free order.

    Checks: every (stage, microbatch) has exactly one F and one B (and one W
    when backward is split) on the rank that owns the stage; on that rank F
    comes before B before W; and executing the lists with each action waiting
    for its cross-stage input never deadlocks. Of several defects, one found while
    indexing (a bad kind, range or rank, a repeat) is reported first, then the first
    missing or misordered action by (stage, microbatch, kind).
    """
    width = 3 if schedule.split_backward else 2
    pairs = min(schedule.num_stages * schedule.microbatches, schedule.num_ops + 1)
    seen = bytearray(width * pairs)
    strays = _index(schedule, seen, width)
    found = [d for d in (_first_missing(seen, width), _first_misordered(schedule, seen, width),
                         min(strays, default=None)) if d is not None]
    if found:
        _refuse(schedule, min(found), seen, width)
    stuck = _first_deadlock(schedule)
    if stuck is not None:
        raise UserError("schedule", f"deadlock: {stuck}", "reorder so every input can arrive")


def _index(schedule: Schedule, seen: bytearray, width: int) -> set[Defect]:
    """Mark each action's slot in `seen`, refusing bad kinds, ranges, ranks and repeats;
    the W actions of an order that does not split the backward, returned apart."""
    n, m = schedule.num_stages, schedule.microbatches
    strays: set[Defect] = set()
    for r, acts in enumerate(schedule.actions):
        for pos, (k, s, i) in enumerate(rank_triples(acts)):
            if k >= len(KINDS):
                raise UserError("schedule", f"rank {r} action {pos}: unknown kind "
                                f"{acts[pos].kind!r}", "use F, B or W")
            if not (0 <= s < n and 0 <= i < m):
                raise UserError("schedule", f"rank {r} action {pos} ({acts[pos]}) is out of "
                                "range", f"stages are 0..{n - 1}, microbatches 0..{m - 1}")
            if schedule.stage_rank(s) != r:
                raise UserError("schedule", f"rank {r} action {pos} ({acts[pos]}) belongs to "
                                f"rank {schedule.stage_rank(s)}", "move it to its own rank")
            if k >= width:
                twice = (s * m + i, k) in strays
                strays.add((s * m + i, k))
            else:
                slot = (s * m + i) * width + k
                twice = slot < len(seen) and seen[slot]
                if slot < len(seen):
                    seen[slot] = 1
            if twice:
                raise UserError("schedule", f"rank {r} runs {acts[pos]} twice",
                                "keep one of them")
    return strays


def _first_missing(seen: bytearray, width: int) -> Defect | None:
    slot = seen.find(0)
    return None if slot < 0 else divmod(slot, width)


def _first_misordered(schedule: Schedule, seen: bytearray, width: int) -> Defect | None:
    """The first action whose predecessor (F before B before W) comes after it."""
    m = schedule.microbatches
    passed = bytearray(len(seen))
    first: Defect | None = None
    for acts in schedule.actions:
        for k, s, i in rank_triples(acts):
            slot = (s * m + i) * width + k
            if k >= width or slot >= len(seen):
                continue
            if k and seen[slot - 1] and not passed[slot - 1]:
                first = min(first or (s * m + i, k), (s * m + i, k))
            passed[slot] = 1
    return first


def _refuse(schedule: Schedule, defect: Defect, seen: bytearray, width: int) -> None:
    pair, k = defect
    s, i = divmod(pair, schedule.microbatches)
    a = Action(KINDS[k], s, i)
    if k == 2 and not schedule.split_backward:
        raise UserError("schedule", f"{Action(W, s, i)} in a schedule without separate W",
                        "drop W or split the backward")
    if not seen[pair * width + k]:
        raise UserError("schedule", f"{a} (kind {a.kind}, stage {s}, microbatch {i}) is "
                        "missing", "every stage needs each kind per microbatch")
    raise UserError("schedule", f"{a} comes before {Action(KINDS[k - 1], s, i)} on rank "
                    f"{schedule.stage_rank(s)}", "order F before B before W")


def _first_deadlock(schedule: Schedule) -> str | None:
    """Run the lists with unit steps; describe where they block, or None."""
    n, m = schedule.num_stages, schedule.microbatches
    done = bytearray(2 * n * m)
    """Per (stage, microbatch), whether its F (and B) ran: the only kinds anyone awaits."""
    orders = [rank_triples(acts) for acts in schedule.actions]
    at = [next(order, None) for order in orders]
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(orders):
            step = at[r]
            while step is not None:
                k, s, i = step
                src = source_stage(KINDS[k], s, n)
                if src is not None and not done[(src * m + i) * 2 + k]:
                    break
                if k < 2:
                    done[(s * m + i) * 2 + k] = 1
                step = next(order, None)
                progress = True
            at[r] = step
    blocked = [f"rank {r} waits at {a} for {dependencies(a, n)}"
               for r, a in ((r, Action(KINDS[t[0]], t[1], t[2])) for r, t in enumerate(at)
                            if t is not None)]
    return "; ".join(blocked) if blocked else None
