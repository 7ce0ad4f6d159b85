"""Chrome trace event JSON: the one schema the simulator and the executor write.

Compute ops are complete events ("ph": "X", ts/dur in microseconds,
pid = rank, tid 0) whose args hold kind, stage, chunk, microbatch and
iteration; transfers are complete events on tid 1 of the sender; memory is
a counter ("ph": "C") per rank. Whole-step ops (kind "R": the data-parallel
gradient all-reduce, "S": the optimizer step) are compute events too, with
stage, chunk and microbatch -1; readers keep them apart from the pipeline's
F/B/W (`Trace.step_ops`). `otherData` carries the run's shape
(schedule, pp, vpp, microbatches, split) so tools can check two traces match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ppsim.errors import UserError
from ppsim.fileio import write_json_atomic

COMPUTE_TID, TRANSFER_TID = 0, 1
STEP_KINDS = ("R", "S")
"""Ops of the whole step, not of a (stage, microbatch): gradient reduce, optimizer step."""


def compute_event(rank: int, kind: str, stage: int, chunk: int, microbatch: int,
                  iteration: int, start_us: float, dur_us: float, **extra: Any) -> dict:
    return {"name": f"{kind}{microbatch}", "cat": "compute", "ph": "X", "pid": rank,
            "tid": COMPUTE_TID, "ts": start_us, "dur": dur_us,
            "args": {"kind": kind, "stage": stage, "chunk": chunk, "microbatch": microbatch,
                     "iteration": iteration, **extra}}


def transfer_event(src: int, dst: int, kind: str, stage: int, microbatch: int, iteration: int,
                   start_us: float, dur_us: float, nbytes: int) -> dict:
    return {"name": f"send {kind}{microbatch} to rank {dst}", "cat": "transfer", "ph": "X",
            "pid": src, "tid": TRANSFER_TID, "ts": start_us, "dur": dur_us,
            "args": {"kind": "send", "op": kind, "src": src, "dst": dst, "stage": stage,
                     "microbatch": microbatch, "iteration": iteration, "bytes": nbytes}}


def memory_event(rank: int, ts_us: float, static: int, activations: int) -> dict:
    return {"name": "memory", "cat": "memory", "ph": "C", "pid": rank, "ts": ts_us,
            "args": {"static": static, "activations": activations}}


def metadata_events(pp: int) -> list[dict]:
    out = []
    for r in range(pp):
        out.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
        out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": COMPUTE_TID,
                    "args": {"name": "compute"}})
        out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": TRANSFER_TID,
                    "args": {"name": "send"}})
    return out


def document(events: list[dict], info: dict[str, Any]) -> dict:
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": info}


def simulation_trace(sim: Any) -> dict:
    """The Chrome trace of a `ppsim.simulator.Simulation` (iteration 0)."""
    p = sim.problem
    tl = sim.timeline
    events = metadata_events(p.schedule.pp)
    for ops in tl.ops:
        for op in ops:
            a = op.action
            events.append(compute_event(op.rank, a.kind, a.stage, op.chunk, a.microbatch, 0,
                                        op.start * 1e3, (op.end - op.start) * 1e3))
    for t in tl.transfers:
        a = t.action
        events.append(transfer_event(t.src, t.dst, a.kind, a.stage, a.microbatch, 0,
                                     t.start * 1e3, (t.end - t.start) * 1e3, t.nbytes))
    for r, mem in enumerate(tl.memory):
        events.append(memory_event(r, 0.0, tl.static[r], 0))
        for time_ms, act, _ in mem:
            events.append(memory_event(r, time_ms * 1e3, tl.static[r], act))
    return document(events, run_info(p, source="simulator", iterations=1, warmup=0))


def run_info(problem: Any, source: str, iterations: int, warmup: int) -> dict[str, Any]:
    s = problem.schedule
    return {"ppsim": 1, "source": source, "schedule": s.name, "pp": s.pp, "vpp": s.vpp,
            "microbatches": s.microbatches, "placement": s.placement,
            "split": list(problem.split.counts), "iterations": iterations,
            "warmup_iterations": warmup}


def write_trace(path: str, trace: dict) -> None:
    write_json_atomic(path, trace)


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class TraceOp:
    rank: int
    kind: str
    stage: int
    chunk: int
    microbatch: int
    iteration: int
    start_us: float
    dur_us: float

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

    @property
    def iterations(self) -> list[int]:
        return sorted({op.iteration for op in self.ops})


def read_trace(path: str) -> Trace:
    """Parse and check a trace; a malformed one is a UserError naming what is wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UserError("trace", f"cannot read {path}: {exc.strerror}",
                        "pass an existing trace file") from None
    except json.JSONDecodeError as exc:
        raise UserError("trace", f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); "
                        "it may be truncated", "re-record or re-export the trace") from None
    return trace_from_json(data, path)


def trace_from_json(data: Any, path: str = "trace") -> Trace:
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise UserError("trace", f"{path} has no traceEvents list",
                        "pass a Chrome trace written by ppsim simulate --trace or ppsim run")
    info = data.get("otherData", {}) if isinstance(data, dict) else {}
    ops, step_ops = [], []
    memory: dict[int, list[tuple[float, int]]] = {}
    for n, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise UserError("trace", f"{path}: event {n} is not an object", "fix or re-record")
        if ev.get("ph") == "X" and ev.get("cat") == "compute":
            args = ev.get("args", {})
            try:
                op = TraceOp(int(ev["pid"]), str(args["kind"]), int(args["stage"]),
                             int(args["chunk"]), int(args["microbatch"]),
                             int(args.get("iteration", 0)), float(ev["ts"]),
                             float(ev["dur"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError("trace", f"{path}: compute event {n} lacks a valid {exc}",
                                "each compute event needs pid, ts, dur and args kind, stage, "
                                "chunk, microbatch") from None
            (step_ops if op.kind in STEP_KINDS else ops).append(op)
        elif ev.get("ph") == "C" and ev.get("name") == "memory":
            args = ev.get("args", {})
            memory.setdefault(int(ev.get("pid", 0)), []).append(
                (float(ev.get("ts", 0.0)), int(sum(v for v in args.values()
                                                   if isinstance(v, (int, float))))))
    if not ops:
        raise UserError("trace", f"{path} holds no compute events",
                        "pass a trace written by ppsim simulate --trace or ppsim run")
    return Trace(path, info, tuple(ops), memory, tuple(step_ops))
