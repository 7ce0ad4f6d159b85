"""Chrome trace event JSON: the one schema the simulator and the executor write.

Compute ops are complete events ("ph": "X", ts/dur in microseconds,
pid = rank, tid 0) whose args hold kind, stage, chunk, microbatch and
iteration; transfers are complete events on tid 1 of the sender; a simulated job's
tensor-, context- and expert-parallel collectives are complete events on tid 2
("cat": "collective", one per group inside each F and B, args exposed_ms: what the op
waits for), and so are its step's data-parallel ones (args op "R", stage and microbatch
-1, exposed_ms: what nothing hides); memory is a counter ("ph": "C") per rank. Whole-step
ops (kind "R": what the data-parallel gradient reduction and parameter gather expose,
"S": the optimizer step) are compute events too, with stage, chunk and microbatch -1;
readers keep them apart from the pipeline's F/B/W (`ppsim.trace.read.Trace.step_ops`). `otherData`
carries the run's shape (schedule, pp, vpp, microbatches, split) so tools can check two
traces match. Reading a trace back, and checking it: ppsim.trace.read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ppsim.config import files
from ppsim.fileio import write_json_atomic
from ppsim.job.lanes import (
    WHAT,
    StageCollectives,
    StepCollectiveSpan,
    op_collectives,
    problem_collectives,
    step_collective_spans,
)
from ppsim.job.throughput import job_info

COMPUTE_TID, TRANSFER_TID, COLLECTIVE_TID = 0, 1, 2
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


def collective_spans(kind: str, start: float, end: float, comm: StageCollectives,
                     per_ms: float = 1.0) -> list[tuple[Any, float, float]]:
    """(collective, start, duration) of the collectives inside one F or B op running
    from `start` to `end` (in units of 1/per_ms ms): one per group from the op's start,
    in the order the layer runs them, each no longer than what is left of the op."""
    out = []
    t = start
    for c in comm.forward if kind == "F" else comm.backward if kind == "B" else ():
        dur = min(c.total_ms * per_ms, max(0.0, end - t))
        out.append((c, t, dur))
        t += dur
    return out


def collective_events(rank: int, kind: str, stage: int, microbatch: int, start_us: float,
                      end_us: float, comm: StageCollectives) -> list[dict]:
    """The collectives inside one F or B op (collective_spans), one trace event each."""
    return [{"name": f"{c.group} {WHAT[c.group]}", "cat": "collective", "ph": "X",
             "pid": rank, "tid": COLLECTIVE_TID, "ts": t, "dur": dur,
             "args": {"group": c.group, "op": kind, "stage": stage, "microbatch": microbatch,
                      "total_ms": c.total_ms, "exposed_ms": c.exposed_ms}}
            for c, t, dur in collective_spans(kind, start_us, end_us, comm, per_ms=1e3)]


def _step_name(what: str) -> str:
    """A step collective's event name: its group, but for the tied embedding's all-reduce,
    which runs between the first and last pipeline stages (Megatron's embedding group),
    not over the data-parallel ranks (there may be one)."""
    return what if what.startswith("embedding") else f"dp {what}"


def step_collective_events(rank: int, spans: list[StepCollectiveSpan]) -> list[dict]:
    """A rank's step collectives (ppsim.job.lanes.step_collective_spans), one trace event
    each."""
    return [{"name": _step_name(s.what), "cat": "collective", "ph": "X", "pid": rank,
             "tid": COLLECTIVE_TID, "ts": s.start_ms * 1e3, "dur": s.ms * 1e3,
             "args": {"group": "dp", "op": "R", "stage": -1, "microbatch": -1,
                      "total_ms": s.ms, "exposed_ms": s.exposed_ms}} for s in spans]


def collective_strips(problem: Any, ops: Any) -> list[tuple[float, float, str, int]]:
    """(start ms, duration ms, "C", microbatch) of the collectives inside one rank's
    simulated ops, for the PNG timeline (ppsim.cli.picture)."""
    comm = problem_collectives(problem)
    if not comm:
        return []
    mine = op_collectives(problem, comm, ops[0].rank) if ops else []
    return [(e["ts"] / 1e3, e["dur"] / 1e3, "C", op.action.microbatch)
            for op, c in zip(ops, mine, strict=True)
            for e in collective_events(op.rank, op.action.kind, op.action.stage,
                                       op.action.microbatch, op.start * 1e3, op.end * 1e3, c)]


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
    """The Chrome trace of a `ppsim.sim.engine.Simulation` (iteration 0)."""
    p = sim.problem
    tl = sim.timeline
    events = metadata_events(p.schedule.pp)
    comm = problem_collectives(p)
    stepped = step_collective_spans(p, tl)
    if comm or any(stepped):
        events += [{"name": "thread_name", "ph": "M", "pid": r, "tid": COLLECTIVE_TID,
                    "args": {"name": "collectives"}} for r in range(p.schedule.pp)]
    for r, spans in enumerate(stepped):
        events += step_collective_events(r, spans)
    for r, ops in enumerate(tl.ops):
        mine = op_collectives(p, comm, r) if comm else []
        for i, op in enumerate(ops):
            a = op.action
            events.append(compute_event(op.rank, a.kind, a.stage, op.chunk, a.microbatch, 0,
                                        op.start * 1e3, (op.end - op.start) * 1e3))
            if comm:
                events += collective_events(op.rank, a.kind, a.stage, a.microbatch,
                                            op.start * 1e3, op.end * 1e3, mine[i])
    for t in tl.transfers:
        a = t.action
        events.append(transfer_event(t.src, t.dst, a.kind, a.stage, a.microbatch, 0,
                                     t.start * 1e3, (t.end - t.start) * 1e3, t.nbytes))
    for r, (end, reduce, step) in enumerate(tl.step):
        for kind, start, dur in step_spans(end, reduce, step):
            events.append(compute_event(r, kind, -1, -1, -1, 0, start * 1e3, dur * 1e3))
    for r, mem in enumerate(tl.memory):
        events.append(memory_event(r, 0.0, tl.static[r], 0))
        for time_ms, act, _ in mem:
            events.append(memory_event(r, time_ms * 1e3, tl.static[r], act))
    info = run_info(p, source="simulator", iterations=1, warmup=0)
    info["iteration_boundary_ms"] = p.hardware.iteration_boundary_ms
    return document(events, info)


class StepSpan(NamedTuple):
    """One piece of a rank's step tail."""

    kind: str
    """R, the data-parallel reduce, or S, the optimizer step."""
    start_ms: float
    ms: float


def step_spans(end_ms: float, reduce_ms: float, optimizer_ms: float) -> list[StepSpan]:
    """A rank's step tail after its last op ends at `end_ms`: R, then S; each only where it
    takes time (as the executor records them: R only with data parallelism)."""
    spans = [StepSpan("R", end_ms, reduce_ms), StepSpan("S", end_ms + reduce_ms, optimizer_ms)]
    return [s for s in spans if s.ms > 0]


def run_info(problem: Any, source: str, iterations: int, warmup: int) -> dict[str, Any]:
    s = problem.schedule
    return {"ppsim": 1, "source": source, "schedule": s.name, "pp": s.pp, "vpp": s.vpp,
            "microbatches": s.microbatches, "placement": s.placement,
            "split": list(problem.split.counts), "iterations": iterations,
            "warmup_iterations": warmup, "job": job_info(problem.hardware.job)}


def write_trace(path: str, trace: dict, flag: str = "--trace") -> None:
    with files.output(flag, path):
        write_json_atomic(path, trace)
