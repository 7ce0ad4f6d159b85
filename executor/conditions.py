"""`ppsim profile` under the run's conditions: what one process alone does not show.

A pipeline run on CPU puts one rank on each core, all computing at once, with
gloo moving every activation and gradient through the host. So the profile
measures, in as many processes as the placement has devices, each timing the
same pieces at the same time (the op times a rank sees beside its neighbours),
plus, between pairs of processes:

- the CPU time one message costs each end (gloo's copies and socket work, which
  compete with compute): a layer's forward and backward timed in blocks with and
  without an exchange of a boundary-sized tensor per op, the difference over the
  message ends each device carries; between devices, and (where the placement puts
  several ranks on a device) between two processes on one device;
- the one-way time of a boundary-sized message posted as its sender starts its next
  op, to a receiver waiting for it (the critical path's hop; gloo's thread competes
  with the sender's compute), which the simulator takes as the link's latency;
- the optimizer step (AdamW over each piece's parameters), fitted as a fixed
  time plus bytes over an achieved bandwidth, the simulator's step model.

On a GPU (or with one device) the pieces are timed alone: ranks sharing a
device are modelled by the simulator's processor sharing from solo times.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ppsim.costs.costfile import PROFILE_REPEATS, _layer, layer_dict
from ppsim.costs.model import ModelCosts
from ppsim.costs.state import ADAM_BYTES_PER_PARAM
from ppsim.executor.alloc import keep_freed_memory
from ppsim.executor.optim import muon_weights, optimizer
from ppsim.executor.profile import Profiler
from ppsim.executor.spawned import free_port, spawn_results
from ppsim.fileio import write_json_atomic


def _layer_op(prof: Any) -> Any:
    """A decoder layer's forward and backward, as the runtime runs them (two ops): a layer
    of the kind most of the model's layers are, the compute a run's messages compete
    with most (a hybrid's MLP, not its first layer's Mamba mixer, 10x the time here)."""
    common = Counter(prof.kinds).most_common(1)[0][0]
    layers = [p for p in prof.pieces if p.kind == "layer"]
    piece = next((p for p in layers if p.layer_kind == common), layers[0])

    def op() -> None:
        y = prof.forward(piece, prof.input_for(piece), 0)
        prof.backward(piece, y)

    return op


def _message_cost(prof: Any, rank: int, n: int, blocks: int = 30,
                  ops: int = 12) -> float | None:
    """CPU ms one message costs each end, from paired processes (0-1, 2-3, ...), each on
    its own device: per op each device carries one send and one receive, so the blocks'
    difference is halved."""
    peer = rank ^ 1
    if peer >= n:  # an odd process out keeps its partners' timing honest: it computes
        peer = -1
    return _exchange_cost(prof, peer, blocks, ops, lag=0, ends=2)


def _local_message_cost(prof: Any, rank: int, k: int, blocks: int = 30,
                        ops: int = 12) -> float | None:
    """CPU ms one message between two processes on one device costs each end: the k
    processes of each device (k * d .. k * d + k - 1) pair up, and every pair's exchange
    puts four ends (two messages) on its device per op. Each message is waited for an op
    later, as the runtime does (its receives are posted ahead): waiting at once would add
    the handoff on a busy core, a wait rather than work."""
    peer = rank ^ 1
    if peer // k != rank // k:  # an odd process out computes beside the pairs
        peer = -1
    return _exchange_cost(prof, peer, blocks, ops, lag=1, ends=4 * (k // 2))


def _exchange_cost(prof: Any, peer: int, blocks: int, ops: int, lag: int,
                   ends: int) -> float | None:
    """A layer's F + B timed in blocks with and without an exchange of a boundary-sized
    tensor with `peer` per op (-1: compute only); the difference of the medians over the
    message ends a device carries per op. Each exchange is waited for `lag` ops later."""
    out = prof.x.detach().clone().contiguous()
    into = [torch.empty_like(out) for _ in range(lag + 1)]
    op = _layer_op(prof)

    def block(exchange: bool, tag: int) -> float:
        dist.barrier()
        pending: list[tuple[Any, Any]] = []
        t0 = time.perf_counter()
        for i in range(ops):
            if exchange and peer >= 0:
                pending.append((dist.irecv(into[i % (lag + 1)], src=peer, tag=tag * ops + i),
                                dist.isend(out, dst=peer, tag=tag * ops + i)))
            op()
            while len(pending) > lag:
                r, s = pending.pop(0)
                r.wait()
                s.wait()
        for r, s in pending:
            r.wait()
            s.wait()
        return (time.perf_counter() - t0) * 1e3 / ops

    plain, sent = [], []
    for b in range(blocks + 1):
        p, s = block(False, 2 * b), block(True, 2 * b + 1)
        if b:  # the first pair warms the connection up
            plain.append(p)
            sent.append(s)
    if peer < 0:
        return None
    return max(0.0, (statistics.median(sent) - statistics.median(plain)) / ends)


def _loaded_latency(prof: Any, rank: int, n: int, rounds: int = 100) -> float | None:
    """One-way ms of a boundary-sized message posted as its sender starts its next op, to
    a receiver waiting for it: a pipeline's critical path. On CPU gloo's thread then
    competes with the sender's compute for its core, which an idle ping-pong never sees.
    Pairs (0, 1), (2, 3), ...; roles swap every round (an even number of them, so each
    end sends as often); one host, so one clock."""
    rounds += rounds % 2
    peer = rank ^ 1
    op = _layer_op(prof)
    out = prof.x.detach().clone().contiguous()
    into = torch.empty_like(out)
    sent, got = [], []
    for i in range(rounds):
        dist.barrier()
        if peer >= n:
            continue
        if (i % 2 == 0) == (rank % 2 == 0):
            op()
            sent.append(time.perf_counter_ns())  # where the executor stamps a send
            work = dist.isend(out, dst=peer, tag=20_000 + i)
            op()  # the next op, while the message moves
            work.wait()
        else:
            dist.irecv(into, src=peer, tag=20_000 + i).wait()
            got.append(time.perf_counter_ns())
    half = rounds // 2
    mine = torch.zeros(half, dtype=torch.int64)
    mine[:len(sent)] = torch.tensor(sent, dtype=torch.int64)
    every = [torch.zeros(half, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(every, mine)
    if peer >= n:
        return None
    ms = [(g - int(s)) / 1e6 for g, s in zip(got, every[peer].tolist(), strict=True)]
    # The mean: 10-20 % of messages wait ~3 ms for the sender's core (a scheduler
    # wake-up behind compute), and a run pays that tail as well. It takes ~50
    # samples to pin down; 9 gave anything from 0.2 to 1.2 ms on the same machine.
    return statistics.fmean(ms[2:]) if len(ms) > 2 else None  # the first warm up


def _sharing(prof: Any, rank: int, k: int, blocks: int = 8, ops: int = 8) -> dict[str, float]:
    """A layer's F + B alone on its device and beside k - 1 others, measured in
    alternating blocks (so the machine's drift hits both alike): processes k*d .. k*d+k-1
    share device d; in an "alone" block only the first of each device computes."""
    op = _layer_op(prof)
    alone, shared = [], []
    for b in range(blocks + 1):
        for together in (False, True):
            dist.barrier()
            if together or rank % k == 0:
                t0 = time.perf_counter()
                for _ in range(ops):
                    op()
                if b:  # the first round warms up
                    (shared if together else alone).append(
                        (time.perf_counter() - t0) * 1e3 / ops)
    return {"alone_ms": statistics.median(alone) if alone else 0.0,
            "shared_ms": statistics.median(shared)}


EVICT_BYTES = 64 << 20
"""Written between timed optimizer steps: more than a CPU's last-level cache (32 MiB
here), so the step finds its state where the run's compute left it, in memory."""


def optimizer_fit(prof: Any, reps: int = 15) -> dict[str, Any]:
    """The run's optimizer step time over one layer's parameters and over every piece's:
    the fixed time and the bandwidth (ADAM_BYTES_PER_PARAM per parameter) through both
    points; `kind` names the optimizer (AdamW, or Muon on the layers' matrices with AdamW
    on the rest, as the run steps them). Each step is timed after the caches are flushed,
    as in a run, where it follows the pipeline's compute (a hot repeat of the step
    measured ~30 % faster here)."""
    layer = next(p for p in prof.pieces if p.kind == "layer")
    scratch = torch.zeros(EVICT_BYTES // 4, device=prof.device)
    points = []
    for pieces in ([layer], prof.pieces):
        params = [q for p in pieces for q in p.module.parameters()]
        muon = muon_weights(p.module for p in pieces if p.kind == "layer") \
            if prof.muon else []
        opt = optimizer(params, lr=1e-9, muon=muon)
        opt.step()  # allocates the states
        times = []
        cuda = prof.device.type == "cuda"
        for _ in range(reps):
            scratch.add_(1.0)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.step()
            if cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        points.append((sum(q.numel() for q in params), statistics.fmean(times)))
    (n1, t1), (n2, t2) = points
    per_param = (t2 - t1) / (n2 - n1) if n2 > n1 and t2 > t1 else t2 / max(1, n2)
    fixed = max(0.0, t2 - per_param * n2)
    return {"fixed_ms": fixed, "gbps": ADAM_BYTES_PER_PARAM / (per_param * 1e6),
            "kind": "muon" if prof.muon else "adam",
            "samples": [{"params": n, "ms": t} for n, t in points]}


def _samples(full: int, least: int, repeats: int) -> int:
    """`full` samples scaled by repeats / PROFILE_REPEATS, never fewer than `least`: a
    profile of few repeats is a quick one, noisier in its messages as in its ops."""
    return max(least, min(full, round(full * repeats / PROFILE_REPEATS)))


def _worker(rank: int, port: int, fields: dict[str, Any], repeats: int, warmup: int,
            microbatches: int, threads: int, out: str, plan: dict[str, Any]) -> None:
    """One of the processes timing the pieces at once; `plan` says where each runs
    (device indices, pinned to cores on CPU or not) and whether pairs exchange messages."""

    devices, n = plan["devices"], len(plan["devices"])
    if plan["device_kind"] == "cuda":
        device = torch.device("cuda", devices[rank] % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if plan["pin"] and hasattr(os, "sched_setaffinity"):  # as the executor pins
            mine = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {mine[devices[rank] % len(mine)]})
    torch.set_num_threads(threads)
    keep_freed_memory()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=300))
    torch.manual_seed(0)
    prof = Profiler(fields, device, microbatches)
    dist.barrier()  # every process times its pieces at the same time
    result: dict[str, Any] = {"all_reduce_ms": _all_reduce_ms()}
    if plan["k"] > 1:  # ranks sharing devices: the sharing and its messages
        result.update(_sharing(prof, rank, plan["k"]))
        if plan["device_kind"] == "cpu":
            result["local_message_cpu_ms"] = _local_message_cost(
                prof, rank, plan["k"], blocks=_samples(30, 8, repeats))
    else:
        prof.run(repeats, warmup)
        costs, _ = prof.costs()
        result.update(layers=[layer_dict(x) for x in costs.layers],
                      embedding=layer_dict(costs.embedding), head=layer_dict(costs.head),
                      tied=layer_dict(costs.tied),
                      message_cpu_ms=_message_cost(prof, rank, n, _samples(30, 8, repeats))
                      if plan["messages"] and n >= 2 else None,
                      message_latency_ms=_loaded_latency(prof, rank, n,
                                                         _samples(100, 24, repeats))
                      if plan["messages"] and n >= 2 else None)
    write_json_atomic(f"{out}.{rank}", result, force=True)
    dist.barrier()
    dist.destroy_process_group()


def _all_reduce_ms(reps: int = 100) -> float:
    """Mean time of the scalar all-reduce the executor ends each iteration with."""
    x = torch.zeros(())
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) * 1e3 / reps


def measure_concurrent(fields: dict[str, Any], devices: list[int], repeats: int, warmup: int,
                       microbatches: int, device_kind: str = "cpu", pin: bool = False,
                       messages: bool = True, k: int = 1) -> list[dict[str, Any]]:
    """Run the profiler in one process per entry of `devices`, all at once; each
    process's results. With k > 1 the devices list holds each device k times in a row,
    and only the sharing of a device is measured (`_sharing`)."""

    n = len(devices)
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    plan = {"devices": list(devices), "device_kind": device_kind, "pin": pin,
            "messages": messages and device_kind == "cpu", "k": k}
    fd, out = tempfile.mkstemp(prefix="ppsim-concurrent-", suffix=".json")
    os.close(fd)
    try:
        results = spawn_results(_worker, (free_port(), fields, repeats, warmup,
                                          microbatches, threads, out, plan), n,
                                [f"{out}.{r}" for r in range(n)], device_kind=device_kind)
    finally:
        for path in [out] + [f"{out}.{r}" for r in range(n)]:
            if os.path.exists(path):
                os.unlink(path)
    return results


def context_switch_ms(alone_ms: float, shared_ms: float, k: int) -> float:
    """The extra work an op pays beside k - 1 others on its device, beyond processor
    sharing's k-fold stretch, from a layer's F + B (two ops) alone and shared."""
    return max(0.0, (shared_ms - k * alone_ms) / (2 * k))


TIMES = ("forward_ms", "backward_ms", "weight_grad_ms", "split_backward_ms")


def pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One cost document body from n processes: each time the median over processes,
    bytes from the first (every process measures the same model)."""
    first = results[0]

    def merge(pieces: list[dict[str, Any]]) -> dict[str, Any]:
        m = {**pieces[0], **{k: statistics.median(p[k] for p in pieces) for k in TIMES}}
        # Medians taken one field at a time need not keep W <= backward <= split path.
        m["weight_grad_ms"] = min(m["weight_grad_ms"], m["backward_ms"])
        m["split_backward_ms"] = max(m["split_backward_ms"], m["backward_ms"])
        return m

    msgs = [r["message_cpu_ms"] for r in results if r.get("message_cpu_ms") is not None]
    lat = [r["message_latency_ms"] for r in results if r.get("message_latency_ms") is not None]
    boundary = statistics.median(r["all_reduce_ms"] for r in results)
    return {"layers": [merge([r["layers"][i] for r in results])
                       for i in range(len(first["layers"]))],
            "embedding": merge([r["embedding"] for r in results]),
            "head": merge([r["head"] for r in results]),
            "tied": first["tied"],  # bytes only
            "message_cpu_ms": statistics.median(msgs) if msgs else 0.0,
            "message_latency_ms": statistics.median(lat) if lat else 0.0,
            "iteration_boundary_ms": boundary}


def cpu_cores() -> int:
    """The cores this process (and the ones it starts) may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def run_conditions(prof: Any, fields: dict[str, Any], device_kind: str,
                   devices: list[int] | None, repeats: int, warmup: int, microbatches: int,
                   progress: Any, pin: bool = False
                   ) -> tuple[dict[str, Any], ModelCosts | None]:
    """The cost file's `conditions` and, on CPU with several devices, the costs measured
    in one process per device at once (None otherwise), never more processes than the
    cores unpinned ones share (the simulator shares those cores among more: the
    conditions' `cores`). Where the placement puts k ranks on a device, k processes per
    device are timed too, for the context-switch cost beyond processor sharing."""

    devs = list(devices) if devices else [0]
    distinct = sorted(set(devs))
    k = max(devs.count(d) for d in distinct)
    cond: dict[str, Any] = {"devices": devs, "processes": 1, "message_cpu_ms": 0.0,
                            "context_switch_ms": 0.0, "iteration_boundary_ms": 0.0,
                            "optimizer": optimizer_fit(prof)}
    costs = None
    if device_kind == "cpu":
        cond["cores"] = cpu_cores()
        if not pin:  # each op alone on a core, its neighbours busy on theirs
            distinct = distinct[:cond["cores"]]
    if device_kind == "cpu" and len(distinct) >= 2:
        if progress is not None:
            progress(f"timing in {len(distinct)} processes at once", 0)
        body = pooled(measure_concurrent(fields, distinct, repeats, warmup, microbatches,
                                         "cpu", pin))
        cond.update(processes=len(distinct), message_cpu_ms=body["message_cpu_ms"],
                    message_latency_ms=body["message_latency_ms"],
                    iteration_boundary_ms=body["iteration_boundary_ms"])
        costs = ModelCosts(layers=tuple(_layer("profile", "layer", x) for x in body["layers"]),
                           embedding=_layer("profile", "embedding", body["embedding"]),
                           head=_layer("profile", "head", body["head"]),
                           tied=_layer("profile", "tied", body["tied"]))
    if k >= 2:
        if progress is not None:
            progress(f"timing {k} processes per device", 0)
        res = measure_concurrent(fields, [d for d in distinct for _ in range(k)], repeats,
                                 warmup, microbatches, device_kind, pin, messages=False, k=k)
        alone = statistics.median(r["alone_ms"] for r in res if r["alone_ms"])
        shared = statistics.median(r["shared_ms"] for r in res)
        cond["context_switch_ms"] = context_switch_ms(alone, shared, k)
        local = [r["local_message_cpu_ms"] for r in res
                 if r.get("local_message_cpu_ms") is not None]
        if local:
            cond["local_message_cpu_ms"] = statistics.median(local)
        cond["shared"] = {"ranks_per_device": k, "layer_fb_alone_ms": alone,
                          "layer_fb_shared_ms": shared}
        if not cond["iteration_boundary_ms"]:
            cond["iteration_boundary_ms"] = statistics.median(r["all_reduce_ms"] for r in res)
    return cond, costs
