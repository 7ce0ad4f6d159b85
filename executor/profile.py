"""`ppsim profile`'s measurements: the executor's own ops, timed one piece at a time.

Pieces are built from the run's model builder with the executor's `Stage`
(embedding alone, one decoder layer of each kind, head alone), with its
recompute mode, and run through the same calls the runtime makes for F
(`module(x)`, plus the loss on the head), B (`torch.autograd.backward`) and W
(`WeightGradStore.run`), so a measured cost is the cost of the op the executor
will run, not of a look-alike. Bytes use the runtime's own accounting:
saved-tensor hooks for activations, params + grads + AdamW states for static.

P2P is measured between two real processes (torch.multiprocessing, gloo on CPU,
NCCL between two GPUs) by ping-pong with the executor's isend/irecv, and fitted
as latency + bytes / bandwidth, the simulator's transfer model.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.executor.alloc import keep_freed_memory
from ppsim.executor.builders import ModelBuilder, builder_spec, layer_kind, load_builder
from ppsim.executor.builders.context import own_tokens
from ppsim.executor.builders.deferral import WeightGradStore
from ppsim.executor.builders.stage import Stage, saved_bytes, tensor_bytes
from ppsim.executor.builders.tensor import message_shape
from ppsim.executor.builders.tied import ties
from ppsim.executor.optim import muon_weights, optimizer
from ppsim.executor.spawned import free_port, spawn_results
from ppsim.fileio import write_json_atomic

Progress = Callable[[str, int], None]
"""progress(description, steps done since the last call)."""


@dataclass
class _Samples:
    """Timings (ms) of one piece; F/B with the plain path, F2/Bi/W with deferred weights."""

    forward: list[float] = field(default_factory=list)
    backward: list[float] = field(default_factory=list)
    forward_split: list[float] = field(default_factory=list)
    input_grad: list[float] = field(default_factory=list)
    weight_grad: list[float] = field(default_factory=list)


@dataclass
class _Piece:
    name: str
    module: Stage
    kind: str
    """"embedding", "layer" or "head"."""
    layer_kind: str = "layer"
    """The builder's kind of this decoder layer (dense, moe, ...)."""
    samples: _Samples = field(default_factory=_Samples)
    activation_bytes: int = 0
    weight_grad_bytes: int = 0
    output_bytes: int = 0
    static_bytes: int = 0


class _Clock:
    """Op timing as the executor's recorder sees it: host ns on CPU, CUDA events on GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b), out
        t0 = time.perf_counter_ns()
        out = fn()
        return (time.perf_counter_ns() - t0) / 1e6, out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def sampled_layers(num_layers: int, most: int = 4) -> list[int]:
    """Layer indices to measure: every decoder layer has the same shape, so a few spread
    over the model give the per-layer cost with more samples than any single layer."""
    if num_layers <= most:
        return list(range(num_layers))
    return sorted({round(i * (num_layers - 1) / (most - 1)) for i in range(most)})


def sampled_by_kind(kinds: list[str], most: int = 4) -> list[int]:
    """A few layers of every kind (spread over that kind's positions)."""
    out: list[int] = []
    for kind in dict.fromkeys(kinds):
        where = [i for i, k in enumerate(kinds) if k == kind]
        out += [where[j] for j in sampled_layers(len(where), most)]
    return sorted(out)


class Profiler:
    """Measures the pieces of one model on one device."""

    def __init__(self, fields: dict[str, Any], device: torch.device, microbatches: int = 1,
                 seed: int = 0, builder: ModelBuilder | None = None) -> None:
        self.builder = builder or load_builder(builder_spec(None, fields), fields,
                                               "model.builder")
        b = self.builder
        self.device, self.seed, self.m = device, seed, max(1, microbatches)
        self.clock = _Clock(device)
        rc = str(fields.get("recompute", "none"))
        self.fsdp = bool(fields.get("fsdp"))
        self.state_shards = int(fields.get("dp", 1)) \
            if fields.get("distributed_optimizer") or self.fsdp else 1
        """Replicas the distributed optimizer (or FSDP) shards Adam's state over (the
        runtime's ppsim.executor.dataparallel.Sharded, FullyShardedPipelined)."""
        self.muon = fields.get("optimizer") == "muon"
        """The decoder layers' 2-D weights keep Muon's state (ppsim.executor.optim)."""
        self.tied = LayerCost()
        """A tied table's bytes (ModelCosts.tied), as the head piece holds it."""
        build: list[tuple[str, str, Stage]] = [
            ("embedding", "embedding", Stage(b, 0, 0, True, False, seed, rc))]
        self.kinds = [layer_kind(b, i) for i in range(b.num_layers)]
        self.layer_indices = sampled_by_kind(self.kinds)
        for i in self.layer_indices:
            build.append((f"layer{i}", "layer", Stage(b, i, 1, False, False, seed, rc)))
        build.append(("head", "head", Stage(b, b.num_layers, 0, False, True, seed, rc)))
        self.pieces = []
        for name, kind, mod in build:
            mod = mod.to(device=device, dtype=b.dtype)
            for p in mod.parameters():  # the runtime's persistent grad buffers
                p.grad = torch.zeros_like(p)
            lk = self.kinds[int(name[5:])] if kind == "layer" else kind
            self.pieces.append(_Piece(name, mod, kind, lk))
        hidden = message_shape(b.activation_shape)
        g = torch.Generator().manual_seed(seed + 1)
        # What a stage receives: an activation (F) and its gradient (B).
        self.x = (torch.randn(hidden, generator=g)).to(device=device, dtype=b.dtype)
        self.grad = (torch.randn(hidden, generator=g) * 1e-3).to(device=device, dtype=b.dtype)
        self.ids = own_tokens(b.microbatch(seed, 0, 0)[0]).to(device)

    # --------------------------------------------------------------- one op each

    def input_for(self, piece: _Piece) -> torch.Tensor:
        if piece.kind == "embedding":
            return self.ids
        return self.x.detach().clone().requires_grad_()

    def forward(self, piece: _Piece, x: torch.Tensor, mb: int) -> torch.Tensor:
        """The runtime's F: the module, and on the head the loss (targets fetched inside)."""
        y = piece.module(x)
        if piece.kind == "head":
            targets = own_tokens(self.builder.microbatch(self.seed, 0, mb)[1]).to(self.device)
            y = self.builder.loss(y, targets) / self.m
        return y

    def backward(self, piece: _Piece, y: torch.Tensor) -> None:
        """The runtime's B: autograd from the output (with the received gradient)."""
        torch.autograd.backward(y, grad_tensors=None if piece.kind == "head" else self.grad)

    def run_once(self, piece: _Piece, rep: int, record: bool) -> None:
        s = piece.samples
        # Plain path (schedules that do not split backward): F, then the whole B.
        x = self.input_for(piece)
        tf, y = self.clock.time(lambda: self.forward(piece, x, rep))
        tb, _ = self.clock.time(lambda: self.backward(piece, y))
        # Split path (zero-bubble): Linear defers weight grads in B; W runs them.
        WeightGradStore.enabled = True
        try:
            x = self.input_for(piece)
            tf2, y = self.clock.time(lambda: self.forward(piece, x, rep))
            key = (0, rep)
            WeightGradStore.deferring, WeightGradStore.key = True, key
            try:
                tbi, _ = self.clock.time(lambda: self.backward(piece, y))
            finally:
                WeightGradStore.deferring, WeightGradStore.key = False, None
            held = WeightGradStore.held_bytes(key)
            tw, _ = self.clock.time(lambda: WeightGradStore.run(key))
        finally:
            WeightGradStore.enabled = False
            WeightGradStore.queues.clear()
        if record:
            s.forward.append(tf)
            s.backward.append(tb)
            s.forward_split.append(tf2)
            s.input_grad.append(tbi)
            s.weight_grad.append(tw)
            piece.weight_grad_bytes = held

    # --------------------------------------------------------------- bytes

    def measure_bytes(self, piece: _Piece) -> None:
        """Activation bytes as the runtime counts them (saved tensors and the piece's
        input; on the head the loss's too), static bytes as its optimizer holds them
        (params, grads, AdamW's or Muon's states after a step; under the distributed
        optimizer its moments and an fp32 master copy a 1 / dp share, under FSDP its
        gradient's shard too)."""
        params = list(piece.module.parameters())
        ptrs = {t.untyped_storage().data_ptr() for t in [*params, *piece.module.buffers()]}
        x = self.input_for(piece)
        with saved_bytes(ptrs) as seen:
            y = self.forward(piece, x, 0)
        if piece.kind != "embedding":
            # A piece counts its input (the runtime holds a stage's input until the B,
            # the next layer saves its own), not its output (freed once sent): summing
            # pieces counts each boundary tensor once, as the runtime does.
            seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        piece.activation_bytes = sum(seen.values())
        piece.output_bytes = 0 if piece.kind == "head" else y.numel() * y.element_size()
        del y
        muon = muon_weights([piece.module]) if self.muon and piece.kind == "layer" else []
        opt = optimizer(params, lr=1e-3, muon=muon)
        opt.step()  # AdamW and Muon allocate their states at the first step
        piece.static_bytes = self._held_bytes(params, opt.state)
        if piece.kind == "head" and ties(self.builder):  # what a rank with both ends holds once
            w = piece.module.head.out.weight  # type: ignore[union-attr]
            self.tied = LayerCost(static_bytes=self._held_bytes([w], opt.state),
                                  params=w.numel())

    def _held_bytes(self, params: list[torch.nn.Parameter], state: dict[Any, Any]) -> int:
        """What the runtime keeps of `params` between steps: weights, gradients, their
        optimizer `state` (a 1 / dp share where it shards)."""
        tensors = params + [p.grad for p in params if p.grad is not None]
        # Sharded keeps one step count for its shard; DDP's AdamW one per tensor.
        kept = [v for p in params for k, v in state.get(p, {}).items()
                if k != "step" or self.state_shards == 1]
        if self.state_shards > 1 and params and (self.fsdp or params[0].dtype != torch.float32):
            kept += [p.float() for p in params]  # the master weights Sharded keeps
        if self.state_shards > 1 and self.fsdp:
            kept += [p.float() for p in params]  # and FSDP its gradients' shard
        return tensor_bytes(tensors) + tensor_bytes(kept) // self.state_shards

    # --------------------------------------------------------------- all

    def run(self, repeats: int, warmup: int, progress: Progress | None = None) -> None:
        for piece in self.pieces:
            self.measure_bytes(piece)
        # Round-robin over pieces each repeat, so slow drift (frequency, other
        # processes) spreads over all pieces instead of biasing one.
        for rep in range(warmup + repeats):
            for piece in self.pieces:
                self.run_once(piece, rep, record=rep >= warmup)
            if progress is not None:
                progress("warm-up" if rep < warmup else "timing F/B/W", 1)

    def costs(self) -> tuple[ModelCosts, dict[str, Any]]:
        """Mean costs per piece (layers pooled) and the per-piece details."""
        details: dict[str, Any] = {}
        # Layers pool by the builder's layer kind (dense, moe, ...); a MoE layer's
        # measured cost applies to every MoE layer, a dense one's to every dense one.
        by_kind: dict[tuple[str, str], list[_Piece]] = {}
        for p in self.pieces:
            by_kind.setdefault((p.kind, p.layer_kind), []).append(p)
            s = p.samples
            details[p.name] = {k: {"mean_ms": _mean(v), "median_ms": _median(v),
                                   "min_ms": min(v) if v else 0.0,
                                   "max_ms": max(v) if v else 0.0}
                               for k, v in (("forward", s.forward), ("backward", s.backward),
                                            ("forward_split", s.forward_split),
                                            ("input_grad", s.input_grad),
                                            ("weight_grad", s.weight_grad))}
        out = {}
        for kind, pieces in by_kind.items():
            pool = _Samples()
            for p in pieces:
                for name in ("forward", "backward", "forward_split", "input_grad",
                             "weight_grad"):
                    getattr(pool, name).extend(getattr(p.samples, name))
            # Means, not medians: an iteration is a sum of ops, and the occasional slow
            # op (the OS, the allocator, gloo's threads) is part of what a run pays.
            f, b = _mean(pool.forward), _mean(pool.backward)
            bi, w = _mean(pool.input_grad), _mean(pool.weight_grad)
            # One LayerCost serves both paths: backward_ms is the plain whole backward
            # (1F1B and friends); split schedules run B = split_backward_ms - W and W,
            # as measured with the deferral (a little more than one pass).
            p0 = pieces[0]
            w = min(w, b)
            out[kind] = LayerCost(forward_ms=f, backward_ms=b, weight_grad_ms=w,
                                  split_backward_ms=max(b, bi + w),
                                  static_bytes=p0.static_bytes,
                                  activation_bytes=p0.activation_bytes,
                                  weight_grad_bytes=p0.weight_grad_bytes,
                                  output_bytes=p0.output_bytes,
                                  params=sum(q.numel() for q in p0.module.parameters()))
        costs = ModelCosts(layers=tuple(out[("layer", k)] for k in self.kinds),
                           embedding=out[("embedding", "embedding")],
                           head=out[("head", "head")], tied=self.tied)
        return costs, details


# ------------------------------------------------------------------ P2P


def _p2p_worker(rank: int, port: int, sizes: list[int], rounds: int, out: str,
                device_kind: str) -> None:
    """One of two processes: ping-pong each size with isend/irecv, as the runtime sends."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    keep_freed_memory()
    nccl = device_kind == "cuda" and torch.cuda.device_count() >= 2
    staged = device_kind == "cuda" and not nccl  # one GPU: via host, like the runtime
    dev = torch.device("cuda", rank) if nccl else torch.device("cpu")
    if device_kind == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2, timeout=timedelta(seconds=60))
    peer = 1 - rank
    results = []
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=dev)
        src = buf.cuda() if staged else buf
        times = []
        for i in range(rounds + 3):
            dist.barrier()
            t0 = time.perf_counter_ns()
            if rank == 0:
                dist.isend(src.to(dev) if staged else src, dst=peer, tag=i).wait()
                dist.irecv(buf, src=peer, tag=i).wait()
                if staged:
                    buf.cuda()
                    torch.cuda.synchronize()
                elif nccl:
                    torch.cuda.synchronize()
            else:
                dist.irecv(buf, src=peer, tag=i).wait()
                if staged:
                    buf.cuda()
                dist.isend(src.to(dev) if staged else buf, dst=peer, tag=i).wait()
            if i >= 3:
                times.append((time.perf_counter_ns() - t0) / 1e6)
        results.append({"bytes": buf.numel() * 4, "one_way_ms": statistics.median(times) / 2})
    if rank == 0:
        write_json_atomic(out, {"backend": "nccl" if nccl else "gloo",
                                "staged_via_host": staged, "samples": results}, force=True)
    dist.barrier()
    dist.destroy_process_group()


def fit_latency_bandwidth(samples: list[dict[str, float]]) -> tuple[float, float]:
    """t = latency + bytes / bandwidth, fitted robustly; (latency ms, bandwidth GB/s).

    The slope is the median of the pairwise slopes and the latency the median intercept
    (Theil-Sen): one size slowed by a busy machine does not bend the fit, as it does a
    least-squares one. Where size made no measurable difference (a median slope not above
    0), all of the largest message's time is taken as transfer, a bandwidth no higher
    than the link's: never 0, which the simulator would read as free transfers.
    """
    xs = [float(s["bytes"]) for s in samples]
    ys = [float(s["one_way_ms"]) for s in samples]
    if not xs:
        return 0.0, 0.0
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs))
              for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    slope = statistics.median(slopes) if slopes else 0.0
    if slope <= 0:
        big = max(range(len(xs)), key=lambda i: (xs[i], ys[i]))
        return 0.0, (xs[big] / ys[big] / 1e6 if ys[big] > 0 else 0.0)
    latency = max(0.0, statistics.median(y - slope * x for x, y in zip(xs, ys, strict=True)))
    return latency, 1.0 / slope / 1e6  # bytes per ms -> GB/s


def p2p_sizes(hidden_bytes: int) -> list[int]:
    """A few sizes around the message the pipeline actually sends."""
    return sorted({4096, 65536, max(4, hidden_bytes), 1 << 20, 4 << 20})


def measure_p2p(device_kind: str, sizes: list[int], rounds: int = 20) -> dict[str, Any]:
    """Spawn two processes, ping-pong, and fit latency + bandwidth."""
    fd, out = tempfile.mkstemp(prefix="ppsim-p2p-", suffix=".json")
    os.close(fd)
    os.unlink(out)  # the worker creates it: its existence says the result is whole
    try:
        res = spawn_results(_p2p_worker, (free_port(), sizes, rounds, out, device_kind), 2,
                            [out], device_kind=device_kind)[0]
    finally:
        if os.path.exists(out):
            os.unlink(out)
    lat, bw = fit_latency_bandwidth(res["samples"])
    return {"latency_ms": lat, "bandwidth_gbps": bw, "backend": res["backend"],
            "staged_via_host": res["staged_via_host"], "rounds": rounds,
            "samples": res["samples"]}
