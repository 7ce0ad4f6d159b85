"""Per-rank recording: op times on a clock shared by all ranks, memory, transfers.

On CPU every rank reads `time.perf_counter_ns` (CLOCK_MONOTONIC on Linux):
ranks on one host share that clock exactly; ranks on other hosts get an
offset estimated from several barrier exits. On CUDA an op's start and end
are CUDA events, turned into host times at the end of each iteration against
an event recorded right after a synchronize, so GPU time is what is measured
rather than the host's launch time.
"""

from __future__ import annotations

import hashlib
import json
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ppsim.job.lanes import StageCollectives
from ppsim.job.traffic import Collective
from ppsim.trace import schema as tr


def _host_id() -> int:
    """This host as a number (a hash of its name), to compare hosts without pickling."""
    digest = hashlib.sha256(socket.gethostname().encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def _all_gather_int(value: int, group: Any) -> list[int]:
    n = dist.get_world_size(group)
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(out, torch.tensor([value], dtype=torch.int64), group=group)
    return [int(t.item()) for t in out]


def align_clocks(rank: int, rounds: int = 7, group: Any = None) -> tuple[int, int]:
    """(offset of this rank's clock to rank 0's, rank 0's epoch), in ns.

    Barrier exits are nearly simultaneous; the median of several rounds of
    (my exit time - rank 0's exit time) estimates the offset. Same host: 0.
    `group` must be a gloo group (the stamps are host tensors).
    """
    diffs, epoch = [], 0
    hosts = _all_gather_int(_host_id(), group)
    for _ in range(rounds):
        dist.barrier(group=group)
        now = time.perf_counter_ns()
        stamps = _all_gather_int(now, group)
        diffs.append(now - stamps[0])
        epoch = stamps[0]
    offset = 0 if hosts[rank] == hosts[0] else int(statistics.median(diffs))
    return offset, epoch


def gather_json(obj: Any, group: Any) -> list[Any] | None:
    """Every rank's `obj` on rank 0 (None elsewhere), as JSON in byte tensors: no pickle."""
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    sizes = _all_gather_int(data.numel(), group)
    rank = dist.get_rank(group)
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[:data.numel()] = data
    bufs = [torch.zeros(max(sizes), dtype=torch.uint8) for _ in sizes] if rank == 0 else None
    dist.gather(padded, bufs, dst=0, group=group)
    if bufs is None:
        return None
    return [json.loads(bytes(b[:n].tolist()).decode()) for b, n in zip(bufs, sizes, strict=True)]


class Recorder:
    """Collects this rank's trace events; times are µs on rank 0's clock. With
    `memory` False no memory counters are written (an engine that cannot count them)."""

    def __init__(self, rank: int, device: torch.device, offset_ns: int, epoch_ns: int,
                 warmup: int = 0, memory: bool = True) -> None:
        self.rank, self.warmup, self.counts_memory = rank, warmup, memory
        self.cuda = device.type == "cuda"
        self.offset_ns, self.epoch_ns = offset_ns, epoch_ns
        self.events: list[dict] = []
        self.iteration = 0
        self._pending: list[tuple[str, Any, Any, dict]] = []
        self._inside: list[tuple[str, Any, Any]] = []
        """The collectives timed since the op began (ppsim.executor.builders.comm_clock)."""
        self._ref: Any = None
        self._ref_ns = 0
        self.static_bytes = 0
        self.activation_bytes = 0
        self.peak_bytes = 0

    # --------------------------------------------------------------- clock

    def host_us(self, t_ns: int | None = None) -> float:
        t = time.perf_counter_ns() if t_ns is None else t_ns
        return (t - self.offset_ns - self.epoch_ns) / 1e3

    def begin_iteration(self, iteration: int) -> None:
        self.iteration = iteration
        if self.cuda:
            torch.cuda.synchronize()
            self._ref_ns = time.perf_counter_ns()
            self._ref = torch.cuda.Event(enable_timing=True)
            self._ref.record()

    def mark(self) -> Any:
        """A point in time: ns on CPU, a recorded CUDA event on GPU."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter_ns()

    def _us(self, mark: Any) -> float:
        if self.cuda:
            return self.host_us(self._ref_ns + int(self._ref.elapsed_time(mark) * 1e6))
        return self.host_us(mark)

    # --------------------------------------------------------------- events

    def begin_op(self) -> None:
        """The collectives timed from here on belong to the op about to run."""
        self._inside = []

    def collective(self, group: str, start: Any, end: Any) -> None:
        """A collective of `group` inside the running op, from mark `start` to `end`."""
        self._inside.append((group, start, end))

    def op(self, start: Any, end: Any, kind: str, stage: int, chunk: int, microbatch: int,
           mem_before: tuple[int, int], mem_after: tuple[int, int]) -> None:
        info = {"kind": kind, "stage": stage, "chunk": chunk, "microbatch": microbatch,
                "mem": (mem_before, mem_after), "collectives": self._inside}
        self._inside = []
        self._pending.append(("op", start, end, info))

    def stretch(self, end: Any) -> None:
        """The op recorded last ends at mark `end` instead (torch computes the last stage's
        loss just after that stage's forward, outside it)."""
        what, start, _, info = self._pending[-1]
        self._pending[-1] = (what, start, end, info)

    def step_op(self, kind: str, fn: Callable[[], Any], static: Callable[[], int]) -> None:
        """Run `fn`, an op of the whole step (R: a gradient reduce or the weights' gather,
        S: the optimizer step), and record it; it belongs to no stage or microbatch (-1).
        `static`: the bytes kept between steps, read after `fn`: the first step creates
        the optimizer's state, static from there on (else a GPU's count, allocated -
        static, would read it as activations)."""
        before = self.memory()
        self.begin_op()
        t0 = self.mark()
        fn()
        self.static_bytes = static()
        self.op(t0, self.mark(), kind, -1, -1, -1, before, self.memory())

    def send(self, start: Any, kind: str, dst: int, stage: int, dst_stage: int,
             microbatch: int, nbytes: int) -> None:
        self._pending.append(("send", start, None, {"kind": kind, "dst": dst, "stage": stage,
                                                    "dst_stage": dst_stage,
                                                    "microbatch": microbatch,
                                                    "bytes": nbytes}))

    def recv(self, end_ns: int, kind: str, src: int, stage: int, microbatch: int) -> None:
        """When the receiver had the message (host clock: gloo receives are host-side)."""
        self.events.append({"ph": "recv", "pid": self.rank, "src": src, "kind": kind,
                            "stage": stage, "microbatch": microbatch,
                            "iteration": self.iteration, "ts": self.host_us(end_ns)})

    def optimizer(self, start: Any, end: Any) -> None:
        self._pending.append(("step", start, end, {}))

    def memory(self) -> tuple[int, int]:
        """(static, activation) bytes now, and track the peak of their sum."""
        if self.cuda:
            alloc = torch.cuda.memory_allocated()
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated())
            return self.static_bytes, max(0, alloc - self.static_bytes)
        self.peak_bytes = max(self.peak_bytes, self.static_bytes + self.activation_bytes)
        return self.static_bytes, self.activation_bytes

    def end_iteration(self) -> None:
        """Resolve this iteration's marks into Chrome events (syncs the GPU once)."""
        if self.cuda:
            torch.cuda.synchronize()
        it, r = self.iteration, self.rank
        extra = {"warmup": True} if it < self.warmup else {}
        for what, start, end, a in self._pending:
            ts = self._us(start)
            if what == "op":
                dur = max(0.0, self._us(end) - ts)
                (s0, a0), (s1, a1) = a["mem"]
                self.events.append(tr.compute_event(r, a["kind"], a["stage"], a["chunk"],
                                                    a["microbatch"], it, ts, dur, **extra))
                if self.counts_memory:
                    self.events.append(tr.memory_event(r, ts, s0, a0))
                    self.events.append(tr.memory_event(r, ts + dur, s1, a1))
                self.events += self._collective_events(a, ts, dur)
            elif what == "send":
                self.events.append({"ph": "send", "pid": r, "iteration": it, "ts": ts, **a})
            else:
                self.events.append({"name": "optimizer step", "cat": "optimizer", "ph": "X",
                                    "pid": r, "tid": tr.COMPUTE_TID, "ts": ts,
                                    "dur": max(0.0, self._us(end) - ts),
                                    "args": {"iteration": it, **extra}})
        self._pending.clear()

    def _collective_events(self, op: dict, ts: float, dur: float) -> list[dict]:
        """The op's collectives as the simulator's trace has them: one event per group, its
        waits summed, in the order the op first made each."""
        waits: dict[str, float] = {}
        for group, start, end in op["collectives"]:
            waits[group] = waits.get(group, 0.0) + max(0.0, self._us(end) - self._us(start))
        side = tuple(Collective(group=g, total_ms=us / 1e3, exposed_ms=us / 1e3)
                     for g, us in waits.items())
        comm = StageCollectives(forward=side, backward=side)
        events = tr.collective_events(self.rank, op["kind"], op["stage"], op["microbatch"], ts,
                                      ts + dur, comm)
        for ev in events:
            ev["args"]["iteration"] = self.iteration
        return events


def _step_reduces(events: list[dict]) -> dict[tuple[int, int], dict]:
    """A part's R events by (iteration, their order in it)."""
    out: dict[tuple[int, int], dict] = {}
    seen: dict[int, int] = {}
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") == "compute" and args.get("kind") == "R":
            it = args["iteration"]
            seen[it] = seen.get(it, -1) + 1
            out[(it, seen[it])] = ev
    return out


def mark_replica_waits(parts: list[dict], pp: int, tp: int, dp: int) -> None:
    """Give each R event of replica 0's traced ranks (`parts`: every global rank's, in
    Megatron's order) the time it waited for the last of its replicas to start the same
    collective (args.replica_wait_us): a collective ends no sooner than its last member
    arrives, and the clocks are aligned (align_clocks), so that part of the op is skew
    between the replicas, not the collective's own cost."""
    if dp < 2:
        return
    for r in range(pp):
        group = [_step_reduces(parts[(d * pp + r) * tp]["events"]) for d in range(dp)]
        for key, ev in group[0].items():
            last = max(g[key]["ts"] for g in group if key in g)
            ev["args"]["replica_wait_us"] = min(max(0.0, last - ev["ts"]), ev["dur"])


def merge_parts(parts: list[list[dict]], pp: int) -> list[dict]:
    """One event list from every rank's part; sends and receives pair into transfers."""
    events = tr.metadata_events(pp)
    arrivals: dict[tuple, float] = {}
    sends = []
    for part in parts:
        for ev in part:
            if ev["ph"] == "recv":
                arrivals[(ev["src"], ev["pid"], ev["kind"], ev["stage"], ev["microbatch"],
                          ev["iteration"])] = ev["ts"]
            elif ev["ph"] == "send":
                sends.append(ev)
            else:
                events.append(ev)
    for s in sends:
        # A transfer ends when the receiver had it; gloo only tells us when its
        # wait returned, so the end is an upper bound on the arrival.
        end = arrivals.get((s["pid"], s["dst"], s["kind"], s["dst_stage"], s["microbatch"],
                            s["iteration"]), s["ts"])
        events.append(tr.transfer_event(s["pid"], s["dst"], s["kind"], s["stage"],
                                        s["microbatch"], s["iteration"], s["ts"],
                                        max(0.0, end - s["ts"]), s["bytes"]))
    collectives = sorted({ev["pid"] for ev in events if ev.get("cat") == "collective"})
    events += [{"name": "thread_name", "ph": "M", "pid": r, "tid": tr.COLLECTIVE_TID,
                "args": {"name": "collectives"}} for r in collectives]
    # Time 0 is the first op of the run (not process start), as in simulated traces.
    t0 = min((ev["ts"] for ev in events if "ts" in ev), default=0.0)
    for ev in events:
        if "ts" in ev:
            ev["ts"] -= t0
    return events
