"""Keep Python's cyclic garbage collector out of timed iterations.

A collection in the middle of an iteration stalls that rank for milliseconds
and shows up in the trace as an op that "took longer"; Megatron's
--manual-gc does the same: collect between iterations, never inside one.
Both engines use it, so their comparison stays fair.
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
