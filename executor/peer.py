"""The comparison engine: the same split and model under torch.distributed.pipelining.

Public classes are used (PipelineStage and the Schedule* classes), except for an
order read from a CSV (`--actions-csv`): torch runs a user's order only through
its `_PipelineScheduleRuntime._load_csv`, which is private. Each
iteration is timed as a whole, from a barrier to the end of the optimizer
step, and the slowest rank's time is the iteration time, which is how the
ppsim engine's iteration span is measured too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from executor.builders import ModelBuilder
from executor.builders.stage import build_stage
from executor.optim import adamw
from executor.quiet import no_gc_pauses
from executor.summary import peer_summary

PEER_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                  "interleaved-1f1b": "ScheduleInterleaved1F1B",
                  "zb-h1": "ScheduleInterleavedZeroBubble",
                  "interleaved-zb": "ScheduleInterleavedZeroBubble",
                  "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV",
                  "csv": "_PipelineScheduleRuntime"}
"""ppsim schedule -> torch class. zb-h1 is torch's interleaved zero bubble on one
chunk per rank (the orders are equal); the V schedules take both chunks."""
SINGLE_STAGE = ("ScheduleGPipe", "Schedule1F1B")
"""torch classes that take one stage; the others take the rank's list of stages."""


def peer_class(name: str, vpp: int) -> str:
    """The torch schedule class for a ppsim schedule (looped BFS is GPipe with chunks)."""
    if name == "gpipe" and vpp > 1:
        return "ScheduleLoopedBFS"
    return PEER_SCHEDULES[name]


class HostStaged(torch.nn.Module):
    """Computes on the GPU, takes and returns host tensors (autograd follows the copies).

    Used when ranks share one GPU: gloo then carries the pipeline's messages, and
    it moves host memory, so the peer stages through the host as ppsim's engine does.
    """

    def __init__(self, inner: torch.nn.Module, device: torch.device) -> None:
        super().__init__()
        self.inner, self.device = inner, device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.to(self.device)).to("cpu")


def _runner(stages: list[Any], sched: Any, loss_fn: Any) -> Any:
    """torch's schedule object for this rank's stages."""
    from torch.distributed import pipelining

    if sched.name == "csv":
        return _csv_runner(stages, sched, loss_fn)
    name = peer_class(sched.name, len(stages))
    cls = getattr(pipelining, name)
    m = sched.microbatches
    return cls(stages[0], m, loss_fn=loss_fn) if name in SINGLE_STAGE else \
        cls(stages, m, loss_fn=loss_fn)


def _csv_runner(stages: list[Any], sched: Any, loss_fn: Any) -> Any:
    """torch's runtime loaded with the order as torch's CSV (the only way torch takes one)."""
    import os
    import tempfile

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from ppsim.torchcsv import to_torch_csv

    runner = _PipelineScheduleRuntime(stages, sched.microbatches, loss_fn=loss_fn)
    fd, path = tempfile.mkstemp(suffix=".csv")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(to_torch_csv(sched))
        runner._load_csv(path)
    finally:
        os.unlink(path)
    return runner


def run_peer(problem: Any, builder: ModelBuilder, rank: int, device: torch.device, args: Any,
             ctrl: Any, progress: Callable[[int, float], None],
             wire: torch.device | None = None, recompute: str = "none") -> dict[str, Any]:
    """Run the split under torch.distributed.pipelining's schedule of the same name, with
    the same model, data, recompute mode and optimizer; time whole iterations."""
    from torch.distributed import pipelining

    split, sched = problem.split, problem.schedule
    m = sched.microbatches
    wire = wire or device
    mods, stages = [], []
    for st in split.stages:
        if st.rank != rank:
            continue
        mod = build_stage(builder, st, args.seed, recompute).to(device=device,
                                                                dtype=builder.dtype)
        mods.append(mod)
        staged = HostStaged(mod, device) if wire != device else mod
        stages.append(pipelining.PipelineStage(staged, st.index, split.num_stages, wire))
    runner = _runner(stages, sched, builder.loss)
    params = [p for mod in mods for p in mod.parameters()]
    opt = adamw(params, args.lr) if params else None
    first = any(st.has_embedding for st in split.stages if st.rank == rank)
    last = any(st.has_head for st in split.stages if st.rank == rank)
    times, losses = [], []
    with no_gc_pauses():
        for it in range(args.iterations):
            batches = [builder.microbatch(args.seed, it, i) for i in range(m)]
            ids = torch.cat([b[0] for b in batches]).to(wire)
            targets = torch.cat([b[1] for b in batches]).to(wire)
            mb_losses: list[Any] = []
            dist.barrier(group=ctrl)
            t0 = time.perf_counter()
            # No logits kept: torchtitan passes return_outputs=False, and ppsim's
            # engine keeps none either, so the comparison is like for like.
            if first:
                runner.step(ids, target=targets if last else None, losses=mb_losses,
                            return_outputs=False)
            elif last:
                runner.step(target=targets, losses=mb_losses, return_outputs=False)
            else:
                runner.step(return_outputs=False)
            if opt is not None:
                opt.step()
                opt.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            stats = torch.tensor([dt, sum(float(x) for x in mb_losses) / m if mb_losses else 0.0],
                                 dtype=torch.float64)
            slowest = stats[:1].clone()
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=ctrl)
            loss = stats[1:].clone()
            dist.all_reduce(loss, group=ctrl)
            times.append(float(slowest.item()) * 1e3)
            losses.append(float(loss.item()))
            progress(it + 1, losses[-1])
    res = peer_summary(problem, builder, args.iterations, args.warmup, times, losses)
    res["recompute"] = sorted({m.recompute for m in mods})  # what the stages were built with
    return res
