"""Collectives timed on a group for real (`ppsim profile` over gloo).

A cost file may hold the data-parallel group's collectives as the profile timed them
at several buffer sizes: all-reduce (DDP's gradient reduce), reduce-scatter and
all-gather (the distributed optimizer's). Each kind becomes a line, a fixed time plus
bytes over a rate, fitted by least squares to its own samples (a measurement of this
machine, nothing published). Where the file has them, the group's collectives are
priced by these lines rather than by the closed forms on a point-to-point link
(ppsim.job.collectives): gloo on a CPU reduces with the processor and gathers in
steps the closed forms do not know.

A profile with tp, cp or ep > 1 also times, bare, the collectives a layer makes over
those groups (its "collectives": one sample each, at one microbatch's message), and
those price the groups' collectives in the simulated trace: one sample gives a time
whatever the size, as gloo between processes that share cores waits mostly on being
scheduled, not on bytes.

Pure logic: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ppsim.config import validate
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
    """The collectives of a group of `size` ranks as timed on it; a kind not timed (None)
    keeps its closed form."""

    size: int
    """Ranks in the group the samples were taken on: the times hold for that size only."""
    all_reduce: TimedCollective | None = None
    reduce_scatter: TimedCollective | None = None
    all_gather: TimedCollective | None = None
    all_to_all: TimedCollective | None = None
    """By each rank's whole send buffer, its own share included."""
    send: TimedCollective | None = None
    """One ring step: each rank sends a buffer to the next and receives one from the one
    before (context parallelism's pass of K and V)."""


@dataclass(frozen=True, kw_only=True)
class TimedGroup:
    """One of a job's groups with its collectives as a cost file timed them."""

    group: str
    """A field of ppsim.job.model.Groups ("tp", "ep", "cp", "cp_a2a", "cp_p2p"), or "dp"
    for every data-parallel one."""
    times: GroupTimes


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


IN_LAYER: dict[str, tuple[str, str, str]] = {
    "all_reduce_ms": ("tp", "bytes", "all_reduce"),
    "all_gather_ms": ("tp", "bytes", "all_gather"),
    "reduce_scatter_ms": ("tp", "bytes", "reduce_scatter"),
    "all_to_all_ms": ("ep", "all_to_all_bytes", "all_to_all"),
    "cp_pass_ms": ("cp", "cp_bytes", "send"),
    "cp_all_gather_ms": ("cp", "cp_bytes", "all_gather"),
    "cp_reduce_scatter_ms": ("cp", "cp_bytes", "reduce_scatter"),
    "cp_all_to_all_ms": ("cp", "cp_bytes", "all_to_all"),
}
"""A profile's bare in-layer times (its "collectives"): the group whose size they hold
for, the key of the bytes they were timed at, the kind of collective."""


_FIX = "re-run ppsim profile, or remove collectives"


def _size(path: str, raw: dict[str, Any], key: str) -> int:
    """A group size as the profile writes it (an integer, not an integral float)."""
    v = raw.get(key)
    where = f"{path}: collectives.{key}"
    if type(v) is not int:
        raise UserError(where, f"must be a group size, got {v!r}"[:200], _FIX)
    return validate.count(where, v, hi=1_000_000, fix=_FIX)


def _amount(path: str, raw: dict[str, Any], key: str) -> float:
    """A time or a byte count: a finite number >= 0."""
    return validate.number(f"{path}: collectives.{key}", raw.get(key), hi=1e18, fix=_FIX)


def _in_layer_group(raw: dict[str, Any], path: str, size_key: str, kind: str
                    ) -> tuple[str, int] | None:
    """The job group a timed kind prices and its size; None where the file cannot say
    (a2a+p2p's all-to-all size missing). Under a2a+p2p the all-to-alls ran over
    cp_a2a_size consecutive ranks and the pass round the ring across them."""
    size = _size(path, raw, size_key)
    if size_key != "cp" or raw.get("cp_comm_type") != "a2a+p2p":
        return size_key, size
    if "cp_a2a_size" not in raw:
        return None
    heads = _size(path, raw, "cp_a2a_size")
    return ("cp_a2a", heads) if kind == "all_to_all" else ("cp_p2p", size // max(1, heads))


def in_layer_times(path: str, raw: Any) -> tuple[TimedGroup, ...]:
    """The groups a cost file's "collectives" (`ppsim profile` with tp, cp or ep > 1)
    timed, one sample a kind; every problem a UserError naming the field."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise UserError(f"{path}: collectives", "must be an object or null", _FIX)
    lines: dict[tuple[str, int], dict[str, TimedCollective]] = {}
    for key, (size_key, bytes_key, kind) in IN_LAYER.items():
        if key not in raw:
            continue
        ms, nbytes = _amount(path, raw, key), _amount(path, raw, bytes_key)
        where = _in_layer_group(raw, path, size_key, kind)
        if where is not None and where[1] > 1:
            lines.setdefault(where, {})[kind] = fit_line([nbytes], [ms])
    return tuple(TimedGroup(group=g, times=GroupTimes(size=n, **kinds))
                 for (g, n), kinds in lines.items())
