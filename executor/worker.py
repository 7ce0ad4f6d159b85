"""The process torchrun starts once per rank: `python -P -m ppsim.executor.worker --spec PATH`.

It reads everything it needs from the run spec `ppsim run` wrote
(ppsim.executor.runspec), so the printed torchrun / sbatch command runs what
`ppsim run` would; `-P` keeps the working directory off the import path, so a
folder named `ppsim` or `executor` there is never imported instead of ppsim's.

Failure protocol (ppsim.executor.failures): a rank whose op raises publishes its error
under an abort key in the job's TCP store (compare-and-set: the first failure wins), prints
one `ppsim-error:` line naming the rank and op, and exits 1 at once. A rank
that fails after another one published (its peer vanished) is a consequence:
it prints `ppsim-abort:` with the first rank's error instead and exits 3.
Every other rank has a watchdog thread polling that key (and
the store itself: if the store vanishes the job is over) and exits 3 within a
fraction of a second, even while blocked in a receive. torchrun also stops the
surviving workers of a node whose worker failed, and the process-group timeout
bounds anything else. Trace parts are written only after the last iteration,
so a failed run leaves no trace. Nothing a peer sends is unpickled: clock
stamps and trace parts travel as tensors and JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import sys
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ppsim.errors import UserError
from ppsim.executor import progress
from ppsim.executor import summary as summ
from ppsim.executor.alloc import keep_freed_memory
from ppsim.executor.builders import ModelBuilder, load_builder
from ppsim.executor.builders.llama import architecture
from ppsim.executor.failures import Watchdog, fail, store_address
from ppsim.executor.groups import pipeline_position, rank_groups
from ppsim.executor.launch import STORE_ENV, printable
from ppsim.executor.peer import Peer, PeerRun, run_peer, slowest_ms
from ppsim.executor.quiet import no_gc_pauses
from ppsim.executor.recorder import (
    Recorder,
    align_clocks,
    gather_json,
    mark_replica_waits,
    merge_parts,
)
from ppsim.executor.runspec import RunSpec
from ppsim.executor.runtime import Fault, Replica, Runtime
from ppsim.fileio import write_json_atomic
from ppsim.job.throughput import over_processes
from ppsim.pipeline.problem import Problem
from ppsim.trace import schema as tr


def _say(tag: str, obj: Any) -> None:
    """One protocol line for the launcher (`ppsim-progress {...}`)."""
    sys.stdout.write(f"ppsim-{tag} {json.dumps(obj)}\n")
    sys.stdout.flush()


def _init_group(backend: str, rank: int, world: int, timeout: timedelta) -> None:
    if not os.environ.get(STORE_ENV):
        dist.init_process_group(backend, timeout=timeout)
        return
    host, port = store_address()
    store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore("ppsim/pg", store), rank=rank,
                            world_size=world, timeout=timeout)


def _devices(kind: str, local_rank: int, local_world: int, placed: int | None = None,
             shared: bool = False) -> tuple[torch.device, torch.device, str]:
    """(compute device, wire device, backend). One GPU shared by ranks: gloo via host.

    `placed` is the rank's device in the [placement] section: on CPU the core it is
    pinned to (so ranks placed on one device share one core, as simulated), on GPUs
    the CUDA device index."""
    if kind == "cpu":
        if placed is not None and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[placed % len(cores)]})
        return torch.device("cpu"), torch.device("cpu"), "gloo"
    n = torch.cuda.device_count()
    if n == 0:
        raise RuntimeError("--device cuda but this node has no CUDA device")
    device = torch.device("cuda", (local_rank if placed is None else placed) % n)
    torch.cuda.set_device(device)
    if local_world <= n and not shared:
        return device, device, "nccl"
    return device, torch.device("cpu"), "gloo"  # NCCL refuses two ranks on one GPU


def run(spec: RunSpec) -> dict[str, Any] | None:
    cfg = spec.run_config()
    problems = spec.problems()
    fields = cfg.model.fields()
    if spec.builder_root and spec.builder_root not in sys.path:
        sys.path.append(spec.builder_root)  # last: ppsim and torch stay the installed ones
    builder = load_builder(spec.builder, fields)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    placed, devs = None, cfg.placement.devices
    if devs and spec.dp == 1:
        placed = int(devs[rank % len(devs)])
    device, wire, backend = _devices(spec.device, int(os.environ.get("LOCAL_RANK", 0)),
                                     int(os.environ.get("LOCAL_WORLD_SIZE", 1)), placed,
                                     bool(devs) and len(set(devs)) < len(devs))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    keep_freed_memory()  # as the profile timed the ops (ppsim.executor.alloc)
    _init_group(backend, rank, world, timedelta(seconds=spec.timeout_s))
    ctrl = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    pp, dp, tp = problems[0].split.pp, spec.dp, int(fields.get("tp", 1))
    cp = int(fields.get("cp", 1))
    if world != pp * dp * tp * cp:
        raise RuntimeError(f"world size {world} != pp {pp} x dp {dp} x tp {tp} x cp {cp}")
    a = architecture(fields)
    replica = replace(rank_groups(rank, pp, dp, a),
                      sharded=bool(fields.get("distributed_optimizer")),
                      fully_sharded=bool(fields.get("fsdp")),
                      muon=fields.get("optimizer") == "muon")
    progress.RANK.record.rank = rank
    dog = Watchdog(rank, world)
    try:
        result = _engine(spec, problems, builder, rank, device, wire, backend, ctrl, replica,
                         str(fields.get("recompute", "none")))
    except BaseException as exc:
        fail(spec, rank, dog, exc)
    dog.close()
    dist.barrier(group=ctrl)  # every rank's work and files are done
    _say("finished", {"rank": rank})
    # Every rank has said so before any tears down: a teardown abort (below) must not get
    # a peer killed before it said it finished. The work is done, so errors do not count.
    with contextlib.suppress(Exception):
        dist.barrier(group=ctrl)
    if os.environ.get("PPSIM_TEST_ABORT_AFTER_FINISH") == str(rank):
        os.abort()  # for the tests: what gloo's rare teardown abort does
    dist.destroy_process_group()
    return result


def _gather_parts(spec: RunSpec, recs: list[tuple[str, Recorder]], rank: int,
                  ctrl: Any) -> list[Any]:
    """Each (folder, recorder)'s part of this rank (written to that folder's parts/ in the
    trace folder when there is one), gathered on rank 0 (None on the others)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    parts = []
    for sub, rec in recs:
        part = {"rank": rank, "events": rec.events, "peak_bytes": rec.peak_bytes,
                "cores": cores}
        if spec.trace_dir:
            write_json_atomic(os.path.join(spec.trace_dir, sub, "parts", f"rank{rank}.json"),
                              part)
        parts.append(gather_json(part, ctrl))
    return parts


def _run_info(spec: RunSpec, p: Problem, meta: dict[str, Any], processes: int,
              **fields: Any) -> dict[str, Any]:
    """A trace's otherData: the run's shape, the job over `processes`, and `fields`."""
    info = tr.run_info(p, "executor", spec.iterations, spec.warmup)
    info["job"] = over_processes(info["job"], processes)
    info.update(meta, **fields)
    return info


def _engine(spec: RunSpec, runs: list[Problem], builder: ModelBuilder, rank: int,
            device: torch.device, wire: torch.device, backend: str,
            ctrl: Any, replica: Replica, recompute: str) -> dict[str, Any] | None:
    """Train `runs` (the run's problem, then --versus's) and summarize; rank 0 gets the
    summary, the others None."""
    problem, iters, warm = runs[0], spec.iterations, spec.warmup
    meta = {"device": str(device.type), "backend": backend, "engine": spec.engine,
            "wire": "host (gloo)" if wire.type == "cpu" and device.type == "cuda" else
            str(wire.type)}
    if spec.engine == "torch":
        return _torch_engine(spec, problem, builder, rank, device, wire, ctrl, recompute, meta)
    offset, epoch = align_clocks(rank, group=ctrl)
    fault = Fault.parse(spec.inject_fault) if spec.inject_fault else None
    pp, tp = problem.split.pp, replica.tp
    # A trace names pipeline ranks (the simulator's pids, and the src / dst the runtime
    # gives its sends): global rank r holds pipeline rank (r // tp) % pp.
    stage_rank = pipeline_position(rank, pp, tp)
    recs = [Recorder(stage_rank, device, offset, epoch, warm) for _ in runs]
    first = rank < pp * tp and rank % tp == 0  # replica 0, tensor rank 0: the traced ranks
    rts = [Runtime(p, builder, stage_rank, device, wire, rec, seed=spec.seed,
                   lr=spec.lr, fault=fault if first and i == 0 else None, recompute=recompute,
                   replica=replica) for i, (p, rec) in enumerate(zip(runs, recs, strict=True))]
    peer = None
    if spec.alongside_torch:  # its own recorder, on the same clock
        peer = PeerRun(Peer(problem, builder, rank, device, spec, wire, recompute,
                            _peer_recorder(rank, device, offset, epoch, warm)))
    losses, timed = _train(spec, rts, rank, ctrl, device, peer)
    parts = _gather_parts(spec, [("versus" if i else "", rec) for i, rec in enumerate(recs)],
                          rank, ctrl)
    peer_parts = _peer_parts(spec, peer, rank, ctrl, "torch")
    if parts[0] is None:
        return None
    for got in parts:
        mark_replica_waits(got, pp, tp, replica.size)  # type: ignore[arg-type]
    # The trace holds replica 0's tensor rank 0 (global ranks 0, tp, ..); the others run
    # the same order.
    parts = [got[:pp * tp:tp] for got in parts]  # type: ignore[index]
    whole = _wholes(spec, parts, pp, timed if peer is not None else None)
    out = []
    for i, (p, got) in enumerate(zip(runs, parts, strict=True)):
        events = merge_parts([q["events"] for q in got[:pp]], pp)
        info = _run_info(spec, p, meta, pp * tp * replica.size, losses=losses[i],
                         dp=replica.data_replicas, cp=replica.cp)
        if whole[i] is not None:
            info["whole_iteration_ms"] = whole[i]
        res = summ.summarize(events, p, builder, iters, warm, losses[i],
                             [q["peak_bytes"] for q in got[:pp]], replica.data_replicas,
                             whole[i])
        # cores: where each rank ran
        res.update(meta, tp=tp, cp=replica.cp, cores=[q["cores"] for q in got[:pp]])
        out.append((tr.document(events, info), res))
    res = out[0][1]
    if spec.versus is not None:
        _finish_files(spec, *out[1], sub="versus", summary=False)
        res["versus"] = out[1][1]
    if peer is not None:
        res["peer"] = _peer_result(spec, problem, builder, peer, peer_parts, meta, "torch")
    _finish_files(spec, *out[0])
    return res


def _torch_engine(spec: RunSpec, problem: Problem, builder: ModelBuilder, rank: int,
                  device: torch.device, wire: torch.device, ctrl: Any, recompute: str,
                  meta: dict[str, Any]) -> dict[str, Any] | None:
    """--engine torch: the split under torch.distributed.pipelining, recorded op by op;
    rank 0 gets the summary, the others None."""
    offset, epoch = align_clocks(rank, group=ctrl)
    run = run_peer(problem, builder, rank, device, spec, ctrl,
                   lambda i, loss: _say("progress", {"iteration": i, "of": spec.iterations,
                                                     "loss": loss}) if rank == 0 else None,
                   wire, recompute, _peer_recorder(rank, device, offset, epoch, spec.warmup))
    parts = _peer_parts(spec, run, rank, ctrl, "")
    if rank != 0:
        return None
    res = _peer_result(spec, problem, builder, run, parts, meta, "")
    _finish_files(spec, None, res)
    return res


def _peer_recorder(rank: int, device: torch.device, offset: int, epoch: int,
                   warmup: int) -> Recorder:
    """The torch engine's recorder: on CPU without memory counters (what torch's stages
    hold is not counted there; a GPU's allocator counts it)."""
    return Recorder(rank, device, offset, epoch, warmup, memory=device.type == "cuda")


def _peer_parts(spec: RunSpec, run: PeerRun | None, rank: int, ctrl: Any,
                sub: str) -> list[Any] | None:
    """The torch engine's parts (every rank's on rank 0) where it was recorded op by op."""
    if run is None or not run.peer.traced:
        return None
    assert run.peer.rec is not None
    return _gather_parts(spec, [(sub, run.peer.rec)], rank, ctrl)[0]


def _peer_result(spec: RunSpec, problem: Problem, builder: ModelBuilder, run: PeerRun,
                 parts: list[Any] | None, meta: dict[str, Any], sub: str) -> dict[str, Any]:
    """The torch engine's summary; its trace written to the folder's `sub` where it was
    recorded. The trace's whole iterations are the engine's timed ones (barrier to the
    end of the step), as its summary's."""
    res = summ.peer_summary(problem, builder, spec.iterations, spec.warmup, run.times_ms,
                            run.losses)
    res.update(meta, engine="torch", recompute=run.peer.recompute)
    if parts is not None:
        pp = problem.split.pp
        info = _run_info(spec, problem, {**meta, "engine": "torch"}, pp, losses=run.losses,
                         dp=1, cp=1, whole_iteration_ms=list(run.times_ms))
        events = merge_parts([q["events"] for q in parts[:pp]], pp)
        _finish_files(spec, tr.document(events, info), res, sub, summary=False)
    return res


def _wholes(spec: RunSpec, parts: list[Any], pp: int,
            timed: list[float] | None) -> list[list[float | None] | None]:
    """Each run's whole iteration lengths when another ran between its iterations (None:
    start to the next start): --versus, where each ends as the other begins, or
    --alongside-torch, timed as the peer is (barrier to the step's end)."""
    if spec.versus is not None:
        return list(summ.alternated_wholes(
            *(summ.iteration_spans([e for q in got[:pp] for e in q["events"]]) for got in parts)))
    if timed is not None:
        return [list(timed)]
    return [None] * len(parts)


def _train(spec: RunSpec, rts: list[Runtime], rank: int, ctrl: Any,
           device: torch.device, peer: PeerRun | None) -> tuple[list[list[float]], list[float]]:
    """Run the iterations: the run's split, then --versus's split, then (with
    --alongside-torch) torch's engine on the run's split, alternating iteration by
    iteration so the machine's drift hits each alike. With the peer, both engines are
    timed the same way (barrier to the end of the step, slowest rank)."""

    losses: list[list[float]] = [[] for _ in rts]
    timed: list[float] = []
    with no_gc_pauses():
        for it in range(spec.iterations):
            for rt, got in zip(rts, losses, strict=True):
                dump = spec.dump_grads if it == 0 and rt is rts[0] else None
                if peer is None:
                    got.append(rt.run_iteration(it, dump))
                else:  # timed as the peer is: its loss is gathered after the timing
                    rt.prepare(it)  # and its batch built before it
                    timed.append(slowest_ms(lambda rt=rt, it=it, dump=dump:
                                            rt.train_step(it, dump), ctrl, device)[0])
                    got.append(rt.global_loss())
            if peer is not None:
                peer.iteration(it, ctrl)
            if rank == 0:
                _say("progress", {"iteration": it + 1, "of": spec.iterations,
                                  "loss": losses[0][-1], "warmup": it < spec.warmup})
    return losses, timed


def _finish_files(spec: RunSpec, doc: dict | None, res: dict, sub: str = "",
                  summary: bool = True) -> None:
    """Write `doc` as `sub`/trace.json of the trace folder (its path in `res`) and, with
    `summary`, `res` as summary.json: a --versus run's and the torch engine's alongside
    are inside the main one."""
    if not spec.trace_dir:
        return
    folder = os.path.join(spec.trace_dir, sub)
    if doc is not None:
        tr.write_trace(os.path.join(folder, "trace.json"), doc)
        res["trace"] = os.path.join(folder, "trace.json")
    if summary:
        write_json_atomic(os.path.join(folder, "summary.json"), res)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ppsim.executor.worker",
                                     description="one rank of a ppsim run (ppsim run starts it)")
    parser.add_argument("--spec", required=True, metavar="PATH",
                        help="the run spec ppsim run (or --print-launch) wrote")
    args = parser.parse_args(argv)
    # A rank forked from torchrun inherits its handlers, which raise on SIGTERM: a rank
    # torchrun stops must just stop, as an exec'd one does.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        spec = RunSpec.read(args.spec)
    except UserError as exc:
        sys.stderr.write(f"ppsim-error: rank {os.environ.get('RANK', '?')} failed: run spec "
                         f"{printable(args.spec)}: {printable(str(exc))}\n")
        return 2
    faulthandler.enable()  # a native abort (SIGABRT, SIGSEGV) still prints where it was
    try:
        run(spec)
    except Exception as exc:  # before the watchdog (the builder, the device, the group)
        sys.stderr.write(f"ppsim-error: rank {os.environ.get('RANK', '?')} failed: "
                         f"{type(exc).__name__}: {printable(str(exc))}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
