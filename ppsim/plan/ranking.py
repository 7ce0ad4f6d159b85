"""The planner's order on splits, and what it lets the branch and bound cut.

Faster first. Times within TIE of each other count as equal (two splits of one
model often differ only by float rounding); among those, fewer empty stages
first (torchtitan refuses a model part with no parameters, and an empty stage
reads as a mistake in a Megatron layout), then lower peak memory, then the
exact time, then the counts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

TIE = 1e-9
"""Iteration times within this relative difference count as equal."""

T = TypeVar("T")


def same_time(a: float, b: float) -> bool:
    """The two iteration times count as equal (within TIE of each other)."""
    return max(a, b) <= min(a, b) * (1 + TIE)


def empty_stages(counts: Sequence[int]) -> int:
    """Stages (virtual ones included) that hold no layer."""
    return sum(1 for c in counts if c == 0)


@dataclass(frozen=True)
class Rank:
    """Where one split that fits memory stands in the planner's order."""

    time_ms: float
    empty: int
    """Stages holding no layer."""
    peak_bytes: int
    counts: tuple[int, ...]

    @classmethod
    def of(cls, counts: tuple[int, ...], time_ms: float, peak_bytes: int) -> Rank:
        return cls(time_ms, empty_stages(counts), peak_bytes, counts)

    def _among_equal_times(self) -> tuple[int, int, float, tuple[int, ...]]:
        return (self.empty, self.peak_bytes, self.time_ms, self.counts)

    def beats(self, other: Rank) -> bool:
        """This split comes before `other`."""
        if not same_time(self.time_ms, other.time_ms):
            return self.time_ms < other.time_ms
        return self._among_equal_times() < other._among_equal_times()

    def cuts(self, bound_ms: float, empty: int, peak_bytes: int) -> bool:
        """No split whose time is at least `bound_ms`, with at least `empty` empty
        stages and a peak of at least `peak_bytes`, comes before this one on time,
        empty stages and peak (one that only ties on all three may be cut)."""
        if bound_ms > self.time_ms * (1 + TIE):
            return True  # slower
        if bound_ms * (1 + TIE) < self.time_ms:
            return False  # may be faster
        return empty > self.empty or (empty == self.empty and peak_bytes >= self.peak_bytes)


def ordered(items: Sequence[T], rank: Callable[[T], Rank]) -> list[T]:
    """`items` best first. Equal time is not transitive, so each pick is made among
    the items left whose time equals the fastest one's."""
    rest = sorted(items, key=lambda x: rank(x).time_ms)
    out = []
    while rest:
        fastest = rank(rest[0]).time_ms
        ties = [x for x in rest if same_time(rank(x).time_ms, fastest)]
        pick = min(ties, key=lambda x: rank(x)._among_equal_times())
        out.append(pick)
        rest.remove(pick)
    return out


@dataclass
class Leaders:
    """The best split found so far and the `k` best, in the planner's order."""

    k: int
    best: Rank | None = None
    top: list[tuple[float, int, int, tuple[int, ...]]] = field(default_factory=list)
    """Max-heap (negated) of the k best by exact time, empty stages, peak: a split of
    equal time but for rounding may fall out, never `best`."""

    def add(self, rank: Rank) -> None:
        if self.best is None or rank.beats(self.best):
            self.best = rank
        item = (-rank.time_ms, -rank.empty, -rank.peak_bytes, tuple(-c for c in rank.counts))
        if len(self.top) < self.k:
            heapq.heappush(self.top, item)
        elif item > self.top[0]:
            heapq.heapreplace(self.top, item)

    @property
    def best_time(self) -> float:
        return self.best.time_ms if self.best is not None else float("inf")

    def ranked(self) -> list[tuple[int, ...]]:
        """The k best found, best first."""
        ranks = {Rank(-t, -e, -p, tuple(-c for c in cs)) for t, e, p, cs in self.top}
        if self.best is not None:
            ranks.add(self.best)
        return [r.counts for r in ordered(list(ranks), lambda r: r)][:self.k]
