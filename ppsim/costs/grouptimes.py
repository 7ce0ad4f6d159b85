"""Collectives timed on a group for real (`ppsim profile` over gloo with dp > 1).

A cost file may hold the data-parallel group's collectives as the profile timed them
at several buffer sizes: all-reduce (DDP's gradient reduce), reduce-scatter and
all-gather (the distributed optimizer's). Each kind becomes a line, a fixed time plus
bytes over a rate, fitted by least squares to its own samples (a measurement of this
machine, nothing published). Where the file has them, the group's collectives are
priced by these lines rather than by the closed forms on a point-to-point link
(ppsim.job.collectives): gloo on a CPU reduces with the processor and gathers in
steps the closed forms do not know.

Pure logic: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ppsim.errors import UserError

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
"""The collectives a data-parallel step makes, as the samples name their times."""
MAX_SAMPLES = 64


@dataclass(frozen=True, kw_only=True)
class TimedCollective:
    """One kind of collective on the group: fixed_ms + bytes / gbps."""

    fixed_ms: float
    """Time of a buffer of no bytes (the steps' latencies and the calls' overhead)."""
    gbps: float
    """Bytes per second of buffer beyond that, in GB/s; 0: bytes cost nothing."""

    def ms(self, nbytes: float) -> float:
        """Time of one collective over a buffer of `nbytes` (the whole buffer: the
        gathered one for all-gather and reduce-scatter)."""
        return self.fixed_ms + (nbytes / (self.gbps * 1e6) if self.gbps > 0 else 0.0)


@dataclass(frozen=True, kw_only=True)
class GroupTimes:
    """The collectives of a group of `size` ranks as timed on it."""

    size: int
    """Ranks in the group the samples were taken on: the times hold for that size only."""
    all_reduce: TimedCollective
    reduce_scatter: TimedCollective
    all_gather: TimedCollective


def fit_line(sizes: list[float], times: list[float]) -> TimedCollective:
    """The least-squares line through (bytes, ms) samples, kept physical: a rate that
    does not rise with the bytes is no rate (all of it fixed), and a negative intercept
    is none (all of it bytes, through the origin)."""
    n = len(sizes)
    if n == 0:
        raise ValueError("fit_line needs at least one sample")
    mx, my = sum(sizes) / n, sum(times) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, times, strict=True)) / sxx \
        if sxx > 0 else 0.0
    if slope <= 0:
        return TimedCollective(fixed_ms=max(0.0, my), gbps=0.0)
    fixed = my - slope * mx
    if fixed < 0:
        slope = sum(x * y for x, y in zip(sizes, times, strict=True)) / sum(x * x for x in sizes)
        fixed = 0.0
    return TimedCollective(fixed_ms=fixed, gbps=1.0 / (slope * 1e6))


def group_times(size: int, samples: list[dict[str, float]]) -> GroupTimes:
    """A GroupTimes fitted to samples of {"bytes": b, "<kind>_ms": t, ...}."""
    sizes = [float(s["bytes"]) for s in samples]
    lines = {k: fit_line(sizes, [float(s[f"{k}_ms"]) for s in samples]) for k in KINDS}
    return GroupTimes(size=size, **lines)


def group_times_from_dict(path: str, raw: Any) -> GroupTimes | None:
    """A cost file's "dp_collectives" ({"size": n, "samples": [...]}, as `ppsim profile`
    writes it), checked: every problem a UserError naming the field."""
    if raw is None:
        return None
    where = f"{path}: dp_collectives"
    fix = "re-run ppsim profile with this config's dp, or remove dp_collectives"
    if not isinstance(raw, dict):
        raise UserError(where, "must be an object or null", fix)
    size = raw.get("size")
    if type(size) is not int or not 2 <= size <= 1_000_000:
        raise UserError(f"{where}.size", f"must be a group size of 2 or more, got {size!r}"[:200],
                        fix)
    samples = raw.get("samples")
    if not isinstance(samples, list) or not 1 <= len(samples) <= MAX_SAMPLES:
        raise UserError(f"{where}.samples", f"must be a list of 1 to {MAX_SAMPLES} samples", fix)
    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            raise UserError(f"{where}.samples[{i}]", "must be an object", fix)
        for key in ("bytes", *(f"{k}_ms" for k in KINDS)):
            v = s.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or v < 0:
                raise UserError(f"{where}.samples[{i}].{key}",
                                f"must be a number >= 0, got {v!r}"[:200], fix)
    return group_times(size, samples)
