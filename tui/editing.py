"""Pure editing logic behind the split editor and the settings form.

No Textual here: every function takes plain values and returns new ones, or
raises `EditRefused` with a one-line reason the UI shows inline. Nothing is
ever half-applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class EditRefused(ValueError):
    """An edit that would make the split or the settings invalid."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


Counts = tuple[int, ...]


def move_boundary(counts: Sequence[int], boundary: int, delta: int) -> Counts:
    """Move the boundary after stage `boundary` by `delta` layers.

    delta > 0 moves it later (stage `boundary` takes layers from the next one),
    delta < 0 earlier (it hands layers to the next one).
    """
    c = list(counts)
    if not 0 <= boundary < len(c) - 1:
        raise EditRefused("split", no_boundary(len(c), boundary))
    if delta == 0:
        return tuple(c)
    giver = boundary + 1 if delta > 0 else boundary
    if c[giver] < abs(delta):
        raise EditRefused("split", f"stage {giver} has only {c[giver]} layer(s) to give")
    c[boundary] += delta
    c[boundary + 1] -= delta
    return tuple(c)


def no_boundary(stages: int, boundary: int) -> str:
    """Why the boundary after stage `boundary` cannot move, in the split's words."""
    if stages == 1:
        return "a single stage holds all the layers; set pp or vpp above 1 to split them"
    if boundary < 0:
        return "stage 0 starts at the first layer; move its end with → or ←"
    if boundary >= stages - 1:
        return f"stage {stages - 1} ends at the last layer; move its start with shift+← or shift+→"
    return ""


def drag_boundary(counts: Sequence[int], boundary: int, position: int) -> Counts:
    """Put the boundary after stage `boundary` at layer `position`, clamped between
    its neighbouring boundaries (so no stage ever goes negative)."""
    c = list(counts)
    if not 0 <= boundary < len(c) - 1:
        raise EditRefused("split", no_boundary(len(c), boundary))
    lo = sum(c[:boundary])
    hi = lo + c[boundary] + c[boundary + 1]
    pos = min(max(position, lo), hi)
    return move_boundary(c, boundary, pos - (lo + c[boundary]))


def click_to_boundary(counts: Sequence[int], stage: int, layer: int) -> Counts:
    """A mouse click on layer `layer` of stage `stage`'s row.

    Right of the stage (or inside it) moves its end boundary to just after the
    clicked layer; left of it moves its start boundary to the clicked layer.
    """
    start = sum(counts[:stage])
    if layer < start and stage > 0:
        return drag_boundary(counts, stage - 1, layer)
    if stage < len(counts) - 1:
        return drag_boundary(counts, stage, layer + 1)
    if stage > 0:  # the last stage has no end boundary: move its start
        return drag_boundary(counts, stage - 1, layer)
    return tuple(counts)


def set_count(counts: Sequence[int], stage: int, value: int) -> Counts:
    """Give `stage` exactly `value` layers; the next stage (the previous one for
    the last stage) absorbs the difference."""
    c = list(counts)
    if not 0 <= stage < len(c):
        raise EditRefused("split", f"no stage {stage}")
    if value < 0:
        raise EditRefused("count", f"{value} is negative; give 0 or more layers")
    if len(c) == 1:
        if value != c[0]:
            raise EditRefused("count", f"a single stage holds all {c[0]} layers")
        return tuple(c)
    other = stage + 1 if stage < len(c) - 1 else stage - 1
    diff = value - c[stage]
    if c[other] - diff < 0:
        raise EditRefused("count", f"stage {other} has only {c[other]} layer(s); "
                          f"at most {c[stage] + c[other]} fit on stage {stage}")
    c[stage] = value
    c[other] -= diff
    return tuple(c)


# ------------------------------------------------------------------ fields


def parse_int(name: str, text: str, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer typed into a field, or EditRefused saying what is wrong."""
    s = text.strip()
    try:
        value = int(s)
    except ValueError:
        raise EditRefused(name, f"{s!r} is not a whole number") from None
    if value < minimum:
        raise EditRefused(name, f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise EditRefused(name, f"must be at most {maximum}, got {value}")
    return value


def parse_float(name: str, text: str, minimum: float = 0.0) -> float:
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        raise EditRefused(name, f"{s!r} is not a number") from None
    if not math.isfinite(value):
        raise EditRefused(name, f"must be a finite number, got {s}")
    if not value > minimum:
        raise EditRefused(name, f"must be more than {minimum:g}, got {s}")
    return value


# ------------------------------------------------------------------ undo/redo


@dataclass
class History(Generic[T]):
    """Undo/redo over immutable states: `push` records a new current state."""

    current: T
    limit: int = 200
    _undo: list[T] = field(default_factory=list)
    _redo: list[T] = field(default_factory=list)

    def push(self, state: T) -> None:
        if state == self.current:
            return
        self._undo.append(self.current)
        del self._undo[:-self.limit]
        self._redo.clear()
        self.current = state

    def undo(self) -> T | None:
        if not self._undo:
            return None
        self._redo.append(self.current)
        self.current = self._undo.pop()
        return self.current

    def redo(self) -> T | None:
        if not self._redo:
            return None
        self._undo.append(self.current)
        self.current = self._redo.pop()
        return self.current

    def revert_to(self, state: T) -> None:
        """Go back to `state` (the last one simulated) after a refused or cancelled
        edit: drop newer entries, or record it when it is not in the undo stack."""
        if self.current == state:
            return
        if state not in self._undo:
            self.push(state)
            return
        while self.current != state:
            self.current = self._undo.pop()

    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    @property
    def can_redo(self) -> bool:
        return bool(self._redo)
