"""Keep Python's cyclic garbage collector out of timed iterations.

A collection in the middle of an iteration stalls that rank for milliseconds
and shows up in the trace as an op that "took longer". So collect once before
the timed loop and not again until it ends (a run is a few iterations, so
nothing accumulates to speak of); collecting between iterations would stall
one rank while the other starts the next iteration. Megatron's --manual-gc
is the same idea. Both engines use it, so their comparison stays fair.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_gc_pauses() -> Iterator[None]:
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
