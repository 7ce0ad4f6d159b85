"""Compact containers for orders read from files: one 8-byte code per action.

A schedule CSV at its cell limit holds a million actions; as `Action` objects they
take ~100 bytes each, as codes 8, so reading a CSV costs about its own size in memory
(issue 27: a reader's memory within 2x the file). Both containers are read-only
sequences that compare equal to the tuples and frozensets a generator builds.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence, Set
from typing import Any, overload

from ppsim.schedules.actions import KINDS, Action

KIND_INDEX = {k: n for n, k in enumerate(KINDS)}
"""ppsim's kind -> the index its code holds."""


def encode(kind_index: int, stage: int, microbatch: int) -> int:
    """One action as an unsigned 64-bit code: stage and kind above, microbatch below
    (both below 10^9, as the CSV reader reads at most 9 digits, so each half fits)."""
    return ((stage << 2 | kind_index) << 32) | microbatch


def decode(code: int) -> Action:
    high = code >> 32
    return Action(KINDS[high & 3], high >> 2, code & 0xFFFFFFFF)


class PackedActions(Sequence[Action]):
    """One rank's ordered actions as codes (see `encode`)."""

    __slots__ = ("codes",)

    def __init__(self, codes: array | None = None) -> None:
        self.codes = codes if codes is not None else array("Q")
        """The codes, in order; append to it while reading."""

    @classmethod
    def of(cls, actions: Iterable[Action]) -> PackedActions:
        return cls(array("Q", (encode(KIND_INDEX[a.kind], a.stage, a.microbatch)
                               for a in actions)))

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, k: int) -> Action: ...
    @overload
    def __getitem__(self, k: slice) -> tuple[Action, ...]: ...
    def __getitem__(self, k: int | slice) -> Action | tuple[Action, ...]:
        if isinstance(k, slice):
            return tuple(map(decode, self.codes[k]))
        return decode(self.codes[k])

    def __iter__(self) -> Iterator[Action]:
        return map(decode, self.codes)

    def triples(self) -> Iterator[tuple[int, int, int]]:
        """(kind index, stage, microbatch) of each action, no Action built."""
        for code in self.codes:
            high = code >> 32
            yield high & 3, high >> 2, code & 0xFFFFFFFF

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedActions):
            return self.codes == other.codes
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.codes.tobytes())

    def __repr__(self) -> str:
        return f"PackedActions({len(self)} actions)"

    def __reduce__(self) -> tuple[Any, ...]:
        return PackedActions, (self.codes,)


class Positions(Set[int]):
    """Positions in a rank's order, sorted, 4 bytes each (CellMarks of a read order)."""

    __slots__ = ("sorted",)

    def __init__(self, positions: array | None = None) -> None:
        self.sorted = positions if positions is not None else array("I")
        """Ascending positions; append in order while reading."""

    def __contains__(self, k: object) -> bool:
        if not isinstance(k, int):
            return False
        n = bisect_left(self.sorted, k)
        return n < len(self.sorted) and self.sorted[n] == k

    def __iter__(self) -> Iterator[int]:
        return iter(self.sorted)

    def __len__(self) -> int:
        return len(self.sorted)

    __hash__ = Set._hash

    def __repr__(self) -> str:
        return f"Positions({len(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return Positions, (self.sorted,)


def unpacked(actions: Sequence[Action]) -> Sequence[Action]:
    """A rank's order as a tuple of Actions, for a loop that reads every action more
    than once (the simulator's engine): decoding a code per read costs it ~2.5x its time."""
    return tuple(actions) if isinstance(actions, PackedActions) else actions


def rank_triples(actions: Sequence[Action]) -> Iterator[tuple[int, int, int]]:
    """(kind index, stage, microbatch) of each action of a rank's order, whichever
    container holds it; an unknown kind reads as index 3."""
    if isinstance(actions, PackedActions):
        return actions.triples()
    return ((KIND_INDEX.get(a.kind, 3), a.stage, a.microbatch) for a in actions)
