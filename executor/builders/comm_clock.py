"""The time an op spends in its tensor-, context- and expert-parallel collectives, by group,
for the trace (ppsim.executor.recorder): each collective a layer makes runs under
`timed(group)`, which hands its start and end marks to the rank's recorder while one is
set (`set_sink`); `ppsim diff` then sets them beside the collectives the simulator
prices inside the same op. A collective waited for inside the op is what is timed: the
blocking ones whole, the ring's passes from the wait on their arrival.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Sink(Protocol):
    """What a recorder offers: a point in time and where a collective's span goes."""

    def mark(self) -> Any: ...

    def collective(self, group: str, start: Any, end: Any) -> None: ...


_SINK: list[Sink | None] = [None]


def set_sink(sink: Sink | None) -> None:
    """The recorder the collectives report to from now on (None: none, nothing timed)."""
    _SINK[0] = sink


@contextmanager
def timed(group: str) -> Iterator[None]:
    """Time what runs inside as a collective of `group` (tp, cp or ep, as the simulator's
    trace names them)."""
    sink = _SINK[0]
    if sink is None:
        yield
        return
    start = sink.mark()
    yield
    sink.collective(group, start, sink.mark())
