"""What the fullest rank holds at the least, under any split or any completion of a
partial one: the planner's memory floor (SplitSearch.floor, SplitSearch.floors).

Between them the ranks hold every layer, the embedding and the head (a tied table twice
when two stages hold it), and at one moment each rank r holds `held[r]` microbatches'
activations of each of its stages (the schedule's memory record whose least count over
the rank's chunks is largest). So rank r's peak is at least the sum over its pieces of
static + held[r] x activation bytes. For any weights lam_r > 0 the fullest rank's peak T
satisfies T x sum(lam) >= sum of lam_r x load_r >= the fixed pieces' share plus, per
layer, its cheapest rank's lam_r x cost (weak duality); lam_r = 1 / (the whole model's
cost on rank r) makes it exact for uniform layers. For a partial split the layers left
can go only to the ranks with stages left, so the average runs over those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ppsim.costs.model import LayerCost, ModelCosts, StageCost, stage_cost, static_floor_bytes
from ppsim.schedules.actions import B, F, Schedule

if TYPE_CHECKING:
    from ppsim.pipeline.problem import Problem

HELD_CACHE = 4096
"""Generated orders whose held counts are kept (a job search times thousands of shapes
over a few hundred orders)."""
_held_by_recipe: dict[tuple[object, ...], tuple[int, ...]] = {}


@dataclass(frozen=True, kw_only=True)
class MemoryFloor:
    """What the fullest rank holds at the least under any split."""

    static_bytes: int
    """Weights, gradients and optimizer state (static_floor_bytes)."""
    peak_bytes: int
    """With the activations each rank holds at its fullest, the layers spread as evenly
    as those loads allow."""
    inflight: tuple[int, ...]
    """Per rank, the microbatches each of its stages holds at once, at the least, at
    one moment; 0 under a memory policy (it may recompute or offload them)."""


class MemoryFloors:
    """The floor of a schedule and model, whole and for partial splits."""

    def __init__(self, costs: ModelCosts, stage_rank: Callable[[int], int], stages: int,
                 pp: int, held: Sequence[int]) -> None:
        self.costs, self.pp, self.S = costs, pp, stages
        self.rank = [stage_rank(s) for s in range(stages)]
        self.held = list(held)
        whole = stage_cost(costs, 0, costs.num_layers, True, True)
        self.lam = [1.0 / max(1, whole.static_bytes + n * whole.activation_bytes)
                    for n in self.held]
        first, last = self.rank[0], self.rank[-1]
        # Where one rank holds both ends it may hold both copies of a table as one (a
        # lower bound takes the fewer).
        self.tied = costs.held_twice(first == last, first == last, first == last).static_bytes
        kinds = [(lc.static_bytes, lc.activation_bytes) for lc in costs.layers]
        self.kinds = sorted(set(kinds))
        index = {k: i for i, k in enumerate(self.kinds)}
        self.before = [[0] * len(self.kinds)]
        for k in kinds:  # per kind, how many of the layers before each index
            row = list(self.before[-1])
            row[index[k]] += 1
            self.before.append(row)
        self.last_stage = [-1] * pp
        """Per rank, its last stage: placed, the rank takes no more layers."""
        for st, r in enumerate(self.rank):
            self.last_stage[r] = st
        self.floor = MemoryFloor(
            static_bytes=static_floor_bytes(costs, pp),
            peak_bytes=int(self._bound([], 0, range(pp)) * (1 - 1e-12)),
            inflight=tuple(self.held))

    def _cost(self, piece: LayerCost | StageCost, r: int) -> float:
        return self.lam[r] * (piece.static_bytes + self.held[r] * piece.activation_bytes)

    def _bound(self, placed: Sequence[StageCost], pos: int, ranks: Sequence[int]) -> float:
        """The weighted bound over `ranks`, the stages `placed` and the layers from `pos`
        left (with the embedding and the head where no placed stage holds them)."""
        if not ranks:
            return 0.0
        member = set(ranks)
        total = sum(self._cost(c, self.rank[s]) for s, c in enumerate(placed)
                    if self.rank[s] in member)
        if not placed:
            total += self._cost(self.costs.embedding, self.rank[0])
        if len(placed) < self.S:
            total += self._cost(self.costs.head, self.rank[-1])
            if self.tied:  # one table where one rank holds both ends
                total -= self.lam[self.rank[-1]] * self.tied
        left = [a - b for a, b in zip(self.before[-1], self.before[pos], strict=True)]
        for (st, act), n in zip(self.kinds, left, strict=True):
            if n:
                total += n * min(self.lam[r] * (st + self.held[r] * act) for r in ranks)
        return total / sum(self.lam[r] for r in ranks)

    def completion(self, placed: Sequence[StageCost], pos: int) -> float:
        """A lower bound on the fullest rank's peak over every completion of the first
        len(placed) stages, layers [pos, L) left for the rest."""
        k = len(placed)
        return self._bound(placed, pos, [r for r in range(self.pp) if self.last_stage[r] >= k])


def held_microbatches(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the most microbatches each of its chunks holds at one moment: over the
    rank's ops, the largest of the least, over its chunks, count of forwards whose
    backward has not run. A generated order's counts are kept by its recipe."""
    if len(schedule.actions) != schedule.pp:
        raise ValueError(f"the order holds actions for {len(schedule.actions)} ranks, not "
                         f"its {schedule.pp} (dropped, as a TUI child's slim copy does?)")
    key = schedule.recipe
    if key is not None and key in _held_by_recipe:
        return _held_by_recipe[key]
    pp, vpp = schedule.pp, schedule.vpp
    held = []
    for actions in schedule.actions:
        open_ = [0] * vpp
        most = 0
        for a in actions:
            if a.kind == F:
                open_[a.stage // pp] += 1
                most = max(most, min(open_))
            elif a.kind == B:
                open_[a.stage // pp] -= 1
        held.append(most)
    out = tuple(held)
    if key is not None:
        if len(_held_by_recipe) >= HELD_CACHE:
            _held_by_recipe.clear()
        _held_by_recipe[key] = out
    return out


def floor_held(problem: Problem) -> tuple[int, ...]:
    """The microbatches' activations the floor counts on each rank: held_microbatches,
    or none under a memory policy (it may recompute or offload them)."""
    s = problem.schedule
    return held_microbatches(s) if problem.memory is None else (0,) * s.pp


def memory_floors(problem: Problem) -> MemoryFloors:
    """The floors of the problem's schedule and model (SplitSearch.floors), counting
    floor_held's activations."""
    s = problem.schedule
    return MemoryFloors(problem.costs, s.stage_rank, s.num_stages, s.pp, floor_held(problem))
