"""Reading a trace (ppsim.trace.schema's events) back: each event checked as it streams
in, a malformed one a UserError naming what is wrong and where."""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast

from ppsim.config import files, limits, validate
from ppsim.errors import UserError
from ppsim.trace import stream
from ppsim.trace.collectives import TraceCollective, read_collective
from ppsim.trace.schema import STEP_KINDS


@dataclass(frozen=True, slots=True)
class TraceOp:
    rank: int
    kind: str
    stage: int
    chunk: int
    microbatch: int
    iteration: int
    start_us: float
    dur_us: float
    wait_us: float = 0.0
    """Of a step's R op in a data-parallel run, the time it waited for the last of its
    replicas to start the same collective (args.replica_wait_us; 0 when not recorded)."""

    @property
    def key(self) -> tuple[int, int, int, str]:
        return (self.rank, self.chunk, self.microbatch, self.kind)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True)
class Trace:
    path: str
    info: dict[str, Any]
    ops: tuple[TraceOp, ...]
    memory: dict[int, list[tuple[float, int]]]
    """Per rank: (ts_us, total bytes) counter samples."""
    step_ops: tuple[TraceOp, ...] = ()
    """R / S ops (gradient reduce, optimizer step), kept out of `ops`."""
    optimizer_ms: dict[int, float] = field(default_factory=dict)
    """Per iteration, the longest "optimizer" event of any rank (ms): context for
    calibrate; an event we cannot read is skipped."""
    collectives: tuple[TraceCollective, ...] = ()
    """The tp / cp / ep collectives inside the F and B ops (ppsim.trace.collectives)."""

    @property
    def iterations(self) -> list[int]:
        return sorted({op.iteration for op in self.ops})


def read_trace(path: str) -> Trace:
    """Parse and check a trace, one event at a time (ppsim.trace.stream); a malformed one
    is a UserError naming what is wrong. A gzipped trace (`.json.gz`, as torch's profiler
    and Perfetto write them) is read through gzip, its JSON held to the same limit."""
    found = _Collector(path)
    with files.open_regular("trace", path, files.MAX_TRACE_BYTES,
                            "Chrome trace (JSON)") as raw:
        try:
            with _uncompressed(raw) as fh:
                fields = stream.scan(fh, path, found.add, "re-record or re-export the trace",
                                     files.MAX_TRACE_BYTES)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise UserError("trace", f"{path} is not a whole gzip file ({exc})",
                            "compress the trace again, or pass it uncompressed") from None
        except OSError as exc:
            raise UserError("trace", f"cannot read {path!r}: {exc.strerror or exc}",
                            "pass a readable trace") from None
    if fields is not None and fields.get("traceEvents") is not True:
        raise _no_events(path)
    return found.trace({} if fields is None else fields.get("otherData", {}))


_GZIP_MAGIC = b"\x1f\x8b"


def _uncompressed(raw: BinaryIO) -> BinaryIO:
    """The file's bytes, through gzip where it opens with gzip's magic number."""
    magic = raw.read(len(_GZIP_MAGIC))
    raw.seek(0)
    if magic != _GZIP_MAGIC:
        return raw
    return cast(BinaryIO, gzip.GzipFile(fileobj=raw, mode="rb"))


# What otherData may say, and the range of each (pp etc. are checked again by diff).
_INFO_COUNTS = {"pp": (1, limits.MAX_STAGES), "vpp": (1, limits.MAX_STAGES),
                "microbatches": (1, limits.MAX_MICROBATCHES),
                "iterations": (0, validate.MAX_INDEX),
                "warmup_iterations": (0, validate.MAX_INDEX)}


def _check_info(info: Any, path: str) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise UserError("trace", f"{path}: otherData must be an object, got "
                        f"{type(info).__name__}", "re-record the trace")
    # A known key written as null counts as absent (readers use .get(key, default)).
    out = {k: v for k, v in info.items() if v is not None}
    for key, (lo, hi) in _INFO_COUNTS.items():
        if info.get(key) is not None:
            out[key] = validate.count(f"{path}: otherData.{key}", info[key], lo=lo, hi=hi,
                                      fix="re-record the trace")
    for key in ("schedule", "placement", "source"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise UserError(f"{path}: otherData.{key}", f"must be a string, got {info[key]!r}"
                            [:200], "re-record the trace")
    if info.get("placement") not in (None, "loop", "v"):
        raise UserError(f"{path}: otherData.placement", f"unknown placement "
                        f"{info['placement']!r}"[:200], "use \"loop\" or \"v\"")
    if info.get("iteration_boundary_ms") is not None:
        out["iteration_boundary_ms"] = validate.duration_ms(
            f"{path}: otherData.iteration_boundary_ms", info["iteration_boundary_ms"])
    wholes = info.get("whole_iteration_ms")
    if wholes is not None:
        if not isinstance(wholes, list) or len(wholes) > validate.MAX_INDEX:
            raise UserError(f"{path}: otherData.whole_iteration_ms", "must be a list of ms "
                            "(null where unknown)", "re-record the trace")
        for i, w in enumerate(wholes):
            if w is not None:
                validate.duration_ms(f"{path}: otherData.whole_iteration_ms[{i}]", w)
    split = info.get("split")
    if split is not None:
        if not isinstance(split, list) or len(split) > limits.MAX_STAGES:
            raise UserError(f"{path}: otherData.split", "must be a list of layer counts",
                            "re-record the trace")
        out["split"] = [validate.count(f"{path}: otherData.split[{i}]", c, lo=0,
                                       hi=limits.MAX_LAYERS) for i, c in enumerate(split)]
    return out


_MAX_US = 1e18
"""Timestamps in microseconds: clocks need not start at 0 (epoch time is ~1.8e15)."""
_MAX_DUR_US = validate.MAX_MS * 1e3
_RANKS = limits.MAX_STAGES - 1


def _index(where: str, value: Any, hi: int) -> int:
    """A count in [0, hi]; the common case is checked inline (traces hold millions)."""
    if type(value) is int and 0 <= value <= hi:
        return value
    return validate.count(where, value, lo=0, hi=hi, fix="re-record the trace")


def _micros(where: str, value: Any, lo: float, hi: float) -> float:
    """Finite microseconds in [lo, hi] (NaN fails the comparison, so takes the slow path)."""
    if (type(value) is float or type(value) is int) and lo <= value <= hi:
        return float(value)
    return validate.number(where, value, lo=lo, hi=hi, fix="times are finite microseconds")


def _compute_op(ev: dict, n: int, path: str) -> TraceOp:
    args = ev.get("args", {})
    where = f"{path}: compute event {n}"
    if not isinstance(args, dict):
        raise UserError("trace", f"{where}: args must be an object, got {type(args).__name__}",
                        "re-record the trace")
    try:
        kind = args["kind"]
        pid, stage, chunk, mb = ev["pid"], args["stage"], args["chunk"], args["microbatch"]
        ts, dur = ev["ts"], ev["dur"]
    except KeyError as exc:
        raise UserError("trace", f"{where} lacks a valid {exc}",
                        "each compute event needs pid, ts, dur and args kind, stage, "
                        "chunk, microbatch") from None
    if not isinstance(kind, str) or kind not in ("F", "B", "W", *STEP_KINDS):
        raise UserError("trace", f"{where}: kind must be F, B, W, R or S, got {kind!r}"[:200],
                        "re-record the trace")

    def place(name: str, value: Any, hi: int) -> int:
        # A whole-step op (R, S) belongs to no stage, chunk or microbatch: -1.
        if kind in STEP_KINDS and type(value) is int and value == -1:
            return -1
        return _index(f"{where}: {name}", value, hi)

    dur_us = _micros(f"{where}: dur", dur, 0.0, _MAX_DUR_US)
    return TraceOp(_index(f"{where}: pid", pid, _RANKS), kind,
                   place("stage", stage, _RANKS), place("chunk", chunk, _RANKS),
                   place("microbatch", mb, validate.MAX_INDEX),
                   _index(f"{where}: iteration", args.get("iteration", 0), validate.MAX_INDEX),
                   _micros(f"{where}: ts", ts, -_MAX_US, _MAX_US), dur_us,
                   _micros(f"{where}: args.replica_wait_us", args.get("replica_wait_us", 0.0),
                           0.0, dur_us))


def _memory_sample(ev: dict, n: int, path: str) -> tuple[int, float, int]:
    where = f"{path}: memory event {n}"
    args = ev.get("args", {})
    if not isinstance(args, dict):
        raise UserError("trace", f"{where}: args must be an object", "re-record the trace")
    rank = _index(f"{where}: pid", ev.get("pid", 0), _RANKS)
    ts = _micros(f"{where}: ts", ev.get("ts", 0.0), -_MAX_US, _MAX_US)
    total = 0
    for k, v in args.items():
        if type(v) is int and 0 <= v <= validate.MAX_BYTES:
            total += v
        elif isinstance(v, (int, float)):
            total += validate.byte_count(f"{where}: args.{k}", v)
    return rank, ts, total


class _Collector:
    """Keeps what a trace's events say (compute ops, step ops, memory), one event at a
    time, so a streamed trace never holds its events as dicts."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ops: list[TraceOp] = []
        self.step_ops: list[TraceOp] = []
        self.memory: dict[int, list[tuple[float, int]]] = {}
        self.optimizer_ms: dict[int, float] = {}
        self.collectives: list[TraceCollective] = []

    def add(self, n: int, ev: Any) -> None:
        if not isinstance(ev, dict):
            raise UserError("trace", f"{self.path} is not a Chrome trace: its event {n} is "
                            f"{type(ev).__name__} {str(ev)[:40]!r}, not an object",
                            "pass a trace written by ppsim simulate --trace or ppsim run; "
                            "a training log goes to ppsim simulate --compare-log")
        if ev.get("ph") == "X" and ev.get("cat") == "compute":
            op = _compute_op(ev, n, self.path)
            (self.step_ops if op.kind in STEP_KINDS else self.ops).append(op)
        elif ev.get("ph") == "C" and ev.get("name") == "memory":
            rank, ts, total = _memory_sample(ev, n, self.path)
            self.memory.setdefault(rank, []).append((ts, total))
        elif ev.get("ph") == "X" and ev.get("cat") == "optimizer":
            self._optimizer(ev)
        elif ev.get("ph") == "X" and ev.get("cat") == "collective":
            self.collectives.append(read_collective(ev, n, self.path, _RANKS))

    def _optimizer(self, ev: dict) -> None:
        args, dur = ev.get("args", {}), ev.get("dur", 0.0)
        if not isinstance(args, dict) or type(dur) not in (int, float) \
                or not 0 <= dur <= _MAX_DUR_US:
            return
        it = args.get("iteration", -1)
        if type(it) is int and 0 <= it <= validate.MAX_INDEX:
            self.optimizer_ms[it] = max(self.optimizer_ms.get(it, 0.0), dur / 1e3)

    def trace(self, info: Any) -> Trace:
        checked = _check_info(info, self.path)
        if not self.ops:
            raise UserError("trace", f"{self.path} holds no compute events",
                            "pass a trace written by ppsim simulate --trace or ppsim run")
        return Trace(self.path, checked, tuple(self.ops), self.memory, tuple(self.step_ops),
                     self.optimizer_ms, tuple(self.collectives))


def _no_events(path: str) -> UserError:
    return UserError("trace", f"{path} has no traceEvents list",
                     "pass a Chrome trace written by ppsim simulate --trace or ppsim run")


def trace_from_json(data: Any, path: str = "trace") -> Trace:
    """A Trace of an already parsed document (as `read_trace` makes of a file)."""
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise _no_events(path)
    info = data.get("otherData", {}) if isinstance(data, dict) else {}
    _check_info(info, path)
    found = _Collector(path)
    for n, ev in enumerate(events):
        found.add(n, ev)
    return found.trace(info)
