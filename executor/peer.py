"""The comparison engine: the same split and model under torch.distributed.pipelining.

Public classes are used (PipelineStage and the Schedule* classes), except for an
order read from a CSV (`--actions-csv`): torch runs a user's order only through
its `_PipelineScheduleRuntime._load_csv`, which is private. Each
iteration is timed as a whole, from a barrier to the end of the optimizer
step, and the slowest rank's time is the iteration time, which is how the
ppsim engine's iteration span is measured too. Given a Recorder, a Peer also
records each op (ppsim.executor.peertrace) and the step's R and S, as the ppsim
engine does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ppsim.executor.builders import ModelBuilder
from ppsim.executor.builders.stage import build_stage, tensor_bytes
from ppsim.executor.dataparallel import optimizer_state
from ppsim.executor.optim import adamw
from ppsim.executor.peertrace import OpTrace
from ppsim.executor.quiet import no_gc_pauses
from ppsim.executor.recorder import Recorder
from ppsim.executor.runspec import RunSpec
from ppsim.executor.runtime import Replica
from ppsim.executor.tied import tie_ends
from ppsim.schedules.generators import TORCH_NAMES
from ppsim.schedules.torchcsv import to_torch_csv

PEER_SCHEDULES = {**{name: "Schedule" + torch for name, torch in TORCH_NAMES.items()},
                  "zb-h1": "ScheduleInterleavedZeroBubble",
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
    """torch's schedule object for this rank's stages. `loss_fn` is each microbatch's
    share of the mean (torchtitan's rescaled loss), so torch scales no gradient: its
    scale_grads divides each stage module's gradients, which would divide a table two
    stages of a rank share (a tied V placement) twice."""
    from torch.distributed import pipelining

    if sched.name == "csv":
        return _csv_runner(stages, sched, loss_fn)
    name = peer_class(sched.name, len(stages))
    cls = getattr(pipelining, name)
    m = sched.microbatches
    return cls(stages[0], m, loss_fn=loss_fn, scale_grads=False) if name in SINGLE_STAGE \
        else cls(stages, m, loss_fn=loss_fn, scale_grads=False)


def _share(loss: Callable[[Any, Any], Any], m: int) -> Callable[[Any, Any], Any]:
    """A microbatch's share of the mean loss over `m` (as the ppsim engine's backward)."""
    return lambda out, target: loss(out, target) / m


def _csv_runner(stages: list[Any], sched: Any, loss_fn: Any) -> Any:
    """torch's runtime loaded with the order as torch's CSV (the only way torch takes one)."""
    import os
    import tempfile

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime


    runner = _PipelineScheduleRuntime(stages, sched.microbatches, loss_fn=loss_fn,
                                      scale_grads=False)
    fd, path = tempfile.mkstemp(suffix=".csv")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(to_torch_csv(sched))
        runner._load_csv(path)
    finally:
        os.unlink(path)
    return runner


class Peer:
    """This rank's stages under torch.distributed.pipelining's schedule of the same name,
    with the same model, data, recompute mode and optimizer, and a tied table tied as the
    ppsim engine ties it (ppsim.executor.tied: one replica, one tensor rank); with `rec`,
    each iteration recorded op by op (`traced` says whether torch let it be)."""

    def __init__(self, problem: Any, builder: ModelBuilder, rank: int, device: torch.device,
                 spec: RunSpec, wire: torch.device | None = None, recompute: str = "none",
                 rec: Recorder | None = None) -> None:
        from torch.distributed import pipelining

        split, sched = problem.split, problem.schedule
        self.builder, self.seed, self.m = builder, spec.seed, sched.microbatches
        self.device, self.wire = device, wire or device
        self.mods = {st.index: build_stage(builder, st, spec.seed, recompute).to(
            device=device, dtype=builder.dtype) for st in split.stages if st.rank == rank}
        self.tied = tie_ends(self.mods, builder, split, Replica(), spec.seed, self.wire)
        stages = [pipelining.PipelineStage(HostStaged(mod, device) if self.wire != device
                                           else mod, index, split.num_stages, self.wire)
                  for index, mod in self.mods.items()]
        self.runner = _runner(stages, sched, _share(builder.loss, self.m))
        self.rec = rec
        self.traced = rec is not None and OpTrace(rec, split, stages, self.runner,
                                                   sched.split_backward).hooked
        # a table two stages share: one parameter, stepped once
        params = self.params = list(dict.fromkeys(
            p for mod in self.mods.values() for p in mod.parameters()))
        self.opt = adamw(params, spec.lr) if params else None
        self.first = any(st.has_embedding for st in split.stages if st.rank == rank)
        self.last = any(st.has_head for st in split.stages if st.rank == rank)
        self.batch: tuple[Any, Any] = (None, None)
        self.losses: list[Any] = []

    def prepare(self, it: int) -> None:
        """The global batch of iteration `it` (built before the timed step)."""
        batches = [self.builder.microbatch(self.seed, it, i) for i in range(self.m)]
        self.batch = (torch.cat([b[0] for b in batches]).to(self.wire),
                      torch.cat([b[1] for b in batches]).to(self.wire))

    def step(self) -> None:
        """One training step on the prepared batch."""
        ids, targets = self.batch
        losses = self.losses = []
        # No logits kept: torchtitan passes return_outputs=False, and ppsim's
        # engine keeps none either, so the comparison is like for like.
        if self.first:
            self.runner.step(ids, target=targets if self.last else None, losses=losses,
                             return_outputs=False)
        elif self.last:
            self.runner.step(target=targets, losses=losses, return_outputs=False)
        else:
            self.runner.step(return_outputs=False)
        if self.tied is not None:  # the tied table's two copies, as the ppsim engine's R
            self._step_op("R", self.tied.reduce)
        if self.opt is not None:
            self._step_op("S", self._optimizer_step)

    def _optimizer_step(self) -> None:
        assert self.opt is not None
        self.opt.step()
        self.opt.zero_grad()

    def _step_op(self, kind: str, fn: Callable[[], None]) -> None:
        if self.rec is None:
            fn()
        else:
            self.rec.step_op(kind, fn, self._static_bytes)

    def _static_bytes(self) -> int:
        """Weights, gradients and Adam's state: what the rank keeps between steps."""
        grads = [p.grad for p in self.params if p.grad is not None]
        return tensor_bytes([*self.params, *grads, *optimizer_state(self.opt)])

    def timed_step(self, it: int, ctrl: Any) -> tuple[float, float]:
        """Iteration `it`: its batch built, then its step timed (slowest_ms) and recorded;
        (the slowest rank's ms, the loss)."""
        self.prepare(it)
        if self.rec is not None:
            self.rec.begin_iteration(it)
        ms, loss = slowest_ms(self.step, ctrl, self.device, self.loss)
        if self.rec is not None:
            self.rec.end_iteration()  # the marks resolved after the timing
        return ms, loss

    def loss(self) -> float:
        """This rank's share of the last step's loss (read after the step is timed)."""
        return sum(float(x) for x in self.losses)  # each microbatch's share of the mean

    @property
    def recompute(self) -> list[str]:
        return sorted({m.recompute for m in self.mods.values()})  # what the stages were built with


def slowest_ms(fn: Callable[[], Any], ctrl: Any, device: torch.device,
               value: Callable[[], float] = lambda: 0.0) -> tuple[float, float]:
    """Time `fn` from a barrier to its end on every rank; (the slowest rank's ms, the sum
    over ranks of `value()`, read after the timing)."""
    dist.barrier(group=ctrl)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    stats = torch.tensor([dt, value()], dtype=torch.float64)
    slowest = stats[:1].clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=ctrl)
    total = stats[1:].clone()
    dist.all_reduce(total, group=ctrl)
    return float(slowest.item()) * 1e3, float(total.item())


@dataclass
class PeerRun:
    """What run_peer leaves: the peer, and each iteration's time and loss, warm-up
    included."""

    peer: Peer
    times_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def iteration(self, it: int, ctrl: Any) -> float:
        """Run, time (and record) iteration `it`; its loss."""
        ms, loss = self.peer.timed_step(it, ctrl)
        self.times_ms.append(ms)
        self.losses.append(loss)
        return loss


def run_peer(problem: Any, builder: ModelBuilder, rank: int, device: torch.device,
             spec: RunSpec, ctrl: Any, progress: Callable[[int, float], None],
             wire: torch.device | None = None, recompute: str = "none",
             rec: Recorder | None = None) -> PeerRun:
    """Run the split under torch's schedule; time whole iterations (and record each op
    into `rec`)."""
    run = PeerRun(Peer(problem, builder, rank, device, spec, wire, recompute, rec))
    with no_gc_pauses():
        for it in range(spec.iterations):
            progress(it + 1, run.iteration(it, ctrl))
    return run
