"""Execute one rank's action list: F, B and W per (stage, microbatch), then step.

The runtime runs exactly `problem.schedule.actions[rank]`, the lists the
simulator times, so a schedule added to `ppsim.schedules` runs here unchanged.
Activations go forward and gradients backward as point-to-point messages
(ppsim.executor.p2p; who sends what to whom is ppsim.pipeline.messages' rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ppsim.executor import progress
from ppsim.executor.builders import ModelBuilder
from ppsim.executor.builders.comm_clock import set_sink
from ppsim.executor.builders.context import own_tokens
from ppsim.executor.builders.deferral import WeightGradStore
from ppsim.executor.builders.policy import apply_policy
from ppsim.executor.builders.stage import Stage, build_stage, saved_bytes, tensor_bytes
from ppsim.executor.builders.tensor import message_shape, sum_partial_grads
from ppsim.executor.dataparallel import replica_data_parallel
from ppsim.executor.optim import muon_weights
from ppsim.executor.outputs import backward_from, deallocate_output
from ppsim.executor.p2p import P2P
from ppsim.executor.recorder import Recorder
from ppsim.executor.tied import tie_ends
from ppsim.pipeline.messages import awaits, feeds
from ppsim.pipeline.problem import Problem
from ppsim.schedules.generators import Action


@dataclass(frozen=True)
class Replica:
    """This rank's pipeline replica under data parallelism (replica-major ranks).

    Global rank = index * pp + pipeline rank: a replica fills consecutive ranks,
    so its point-to-point traffic stays among neighbours; `group` holds the
    ranks of the same pipeline position in every replica (the gradient all-reduce).
    """

    index: int = 0
    size: int = 1
    group: Any = None
    tp: int = 1
    """Tensor-parallel ranks per pipeline rank (innermost: global = (replica x pp + pipeline
    rank) x tp + tensor rank, Megatron's order)."""
    tp_rank: int = 0
    sharded: bool = False
    """Megatron's distributed optimizer: each replica steps 1 / size of the weights
    (ppsim.executor.dataparallel)."""
    fully_sharded: bool = False
    """torchtitan's FSDP (its pipelined form): the shards hold the fp32 weights too."""
    muon: bool = False
    """Megatron's --optimizer muon: the decoder layers' 2-D weights on Muon, the rest on
    AdamW (ppsim.executor.optim)."""
    experts_apart: bool = False
    """The routed experts' gradients reduce over groups of their own (ep > 1, or an etp
    other than 1 and tp: ppsim.executor.places)."""
    expert_group: Any = None
    """The ranks holding this rank's experts (tp x dp / (ep x etp) of them; None when
    one): the experts' gradients reduce over it."""
    expert_replicas: int = 1
    """Ranks in expert_group."""
    expert_index: int = 0
    """This rank's index in it."""
    cp: int = 1
    """Context-parallel ranks per replica of the data: `size` counts each as a replica
    (their gradients reduce together), consecutive indices share a batch and each takes
    its part of the sequence (ppsim.executor.builders.context)."""

    @property
    def data_index(self) -> int:
        """Which replica of the data this rank's batch is."""
        return self.index // self.cp

    @property
    def data_replicas(self) -> int:
        """Replicas of the data (dp)."""
        return self.size // self.cp

    def global_rank(self, pipeline_rank: int, pp: int) -> int:
        return (self.index * pp + pipeline_rank) * self.tp + self.tp_rank


@dataclass(frozen=True)
class Fault:
    """Raise inside one op, to test that failures end every rank (--inject-fault)."""

    rank: int
    kind: str
    stage: int
    microbatch: int
    iteration: int = 0

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = text.split(":")
        if len(parts) not in (4, 5) or parts[1] not in ("F", "B", "W") or not all(
                p.isdigit() for i, p in enumerate(parts) if i != 1):
            raise ValueError(text)
        nums = [int(p) for i, p in enumerate(parts) if i != 1]
        return cls(nums[0], parts[1], *nums[1:])


class OpFailed(RuntimeError):
    """An op raised; the message names the rank and the op."""

    def __init__(self, rank: int, action: Action, chunk: int, iteration: int,
                 exc: BaseException) -> None:
        super().__init__(f"rank {rank} failed in {action.kind}{action.microbatch} (kind "
                         f"{action.kind}, stage {action.stage}, chunk {chunk}, microbatch "
                         f"{action.microbatch}) of iteration {iteration}: "
                         f"{type(exc).__name__}: {exc}")


class Runtime:
    """Builds this rank's chunks and runs its action list, iteration by iteration."""

    def __init__(self, problem: Problem, builder: ModelBuilder, rank: int,
                 device: torch.device, wire: torch.device, recorder: Recorder, seed: int = 0,
                 lr: float = 1e-3, fault: Fault | None = None, recompute: str = "none",
                 replica: Replica | None = None) -> None:
        self.split, self.schedule = problem.split, problem.schedule
        self.builder, self.rank, self.device, self.seed = builder, rank, device, seed
        self.rec, self.fault = recorder, fault
        self.replica = replica or Replica()
        self.last = self.schedule.num_stages - 1
        self.modules: dict[int, Stage] = {}
        memory = problem.memory  # a memory policy per stage, or the global mode
        for st in self.split.stages:
            if st.rank == rank:
                mod = build_stage(builder, st, seed, "none" if memory else recompute)
                if memory is not None:
                    apply_policy(mod.layers, memory.policies[st.index])
                self.modules[st.index] = mod.to(device=device, dtype=builder.dtype)
        self.tied = tie_ends(self.modules, builder, self.split, self.replica, seed, wire)
        named: dict[torch.nn.Parameter, str] = {}
        for m in self.modules.values():  # a table two stages share: once, as its first name
            for name, p in m.named_parameters():
                named.setdefault(p, name)
        self.params, self.names = list(named), list(named.values())
        muon = muon_weights(self.modules.values()) if self.replica.muon else []
        self.dp = replica_data_parallel(self.params, device, lr, self.replica, wire, muon)
        # Parameters and buffers (rotary tables) are static, never activations.
        self._param_ptrs = {t.untyped_storage().data_ptr() for m in self.modules.values()
                            for t in [*m.parameters(), *m.buffers()]}
        WeightGradStore.reset()
        WeightGradStore.enabled = self.schedule.split_backward
        pp = self.schedule.pp
        self.p2p = P2P(self.schedule, rank,
                       message_shape(builder.activation_shape),
                       builder.dtype,
                       device, wire, recorder,
                       peers=[self.replica.global_rank(r, pp) for r in range(pp)])
        self._held: dict[tuple[int, int], int] = {}
        self._stage_bytes: dict[int, int] = {}
        self._inputs: dict[tuple[int, int], torch.Tensor] = {}
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.loss = torch.zeros((), device=device)
        self.iteration = 0
        self._batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._prepared = -1

    # --------------------------------------------------------------- bookkeeping

    def _static_bytes(self) -> int:
        return tensor_bytes(self.dp.static_tensors())

    def _hold(self, key: tuple[int, int], nbytes: int) -> None:
        self.rec.activation_bytes += nbytes - self._held.get(key, 0)
        if nbytes:
            self._held[key] = nbytes
        else:
            self._held.pop(key, None)

    def prepare(self, iteration: int) -> None:
        """Build iteration `iteration`'s microbatches (inputs and targets, on the device)
        ahead of its step, as a data loader would; the torch peer builds its batch
        before its timed step too. Replica r's microbatch i is the global batch's
        microbatch r * m + i (each context-parallel rank its part of the sequence)."""
        m = self.schedule.microbatches
        if self.modules.keys() & {0, self.last}:
            batches = [self.builder.microbatch(self.seed, iteration,
                                               self.replica.data_index * m + i)
                       for i in range(m)]
            self._batches = [(own_tokens(ids).to(self.device), own_tokens(t).to(self.device))
                             for ids, t in batches]
        self._prepared = iteration

    def _batch(self, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._batches[mb]

    # --------------------------------------------------------------- actions

    def _forward(self, a: Action, start: list[Any]) -> None:
        s, mb = a.stage, a.microbatch
        inbox, out = awaits(a, self.last + 1), feeds(a, self.last + 1)
        if inbox is None:  # the first stage reads the batch
            x = self._batch(mb)[0]
        else:
            x = self.p2p.recv(inbox).requires_grad_()
        start.append(self.rec.mark())
        target = self._batch(mb)[1] if out is None else None
        if s in self._stage_bytes or self.rec.cuda:
            y = self._stage_forward(s, x, target)
        else:
            y = self._measured_forward(s, x, target)
        if target is not None:  # the last stage feeds its own B through the loss
            self.loss += y.detach()
        else:
            self.p2p.send(y, out, s)
            if self.schedule.stage_rank(out.stage) != self.rank and y is not x:
                deallocate_output(y)
        self._inputs[(s, mb)], self._outputs[(s, mb)] = x, y
        self._hold((s, mb), self._stage_bytes.get(s, 0))

    def _stage_forward(self, s: int, x: torch.Tensor, target: torch.Tensor | None
                       ) -> torch.Tensor:
        """Stage s's output, or with a `target` (the last stage) its share of the loss
        (the logits passed straight on, bound to no local: Stage.forward says why)."""
        if target is None:
            return self.modules[s](x)
        return self.builder.loss(self.modules[s](x), target) / self.schedule.microbatches

    def _measured_forward(self, s: int, x: torch.Tensor, target: torch.Tensor | None
                          ) -> torch.Tensor:
        """Forward once counting what autograd keeps per microbatch (saved tensors and
        checkpoint inputs). Shapes are static, so one measurement per stage holds for
        every microbatch."""
        with saved_bytes(self._param_ptrs) as seen:
            y = self._stage_forward(s, x, target)
        if x.requires_grad:  # hidden states: held in self._inputs until the B
            seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        self._stage_bytes[s] = sum(seen.values())
        return y

    def _backward(self, a: Action, start: list[Any]) -> None:
        s, mb = a.stage, a.microbatch
        inbox, out = awaits(a, self.last + 1), feeds(a, self.last + 1)
        grad = None if inbox is None else self.p2p.recv(inbox)
        start.append(self.rec.mark())
        x, y = self._inputs.pop((s, mb)), self._outputs.pop((s, mb))
        if self.schedule.split_backward:
            WeightGradStore.deferring, WeightGradStore.key = True, (s, mb)
        try:
            if y.requires_grad:
                backward_from(y, grad)
            elif x.requires_grad:  # an empty stage: the gradient passes through
                x.grad = grad
        finally:
            WeightGradStore.deferring, WeightGradStore.key = False, None
        if out is not None:
            self.p2p.send(x.grad, out, s)
        self._hold((s, mb), WeightGradStore.held_bytes((s, mb)))

    def _weight(self, a: Action, start: list[Any]) -> None:
        start.append(self.rec.mark())
        WeightGradStore.run((a.stage, a.microbatch))
        self._hold((a.stage, a.microbatch), 0)

    # --------------------------------------------------------------- iteration

    def run_iteration(self, iteration: int, dump_grads: str | None = None) -> float:
        """Run the action list, reduce gradients across replicas (R), step (S);
        returns the global batch's loss."""
        self.train_step(iteration, dump_grads)
        return self.global_loss()

    def train_step(self, iteration: int, dump_grads: str | None = None) -> None:
        """One iteration's ops, the gradient all-reduce and the optimizer step."""
        self.iteration = iteration
        if self._prepared != iteration:
            self.prepare(iteration)
        self.rec.begin_iteration(iteration)
        set_sink(self.rec)  # this run's collectives, op by op
        self.rec.static_bytes = self._static_bytes()
        self.loss.zero_()
        run = {"F": self._forward, "B": self._backward, "W": self._weight}
        for a in self.schedule.actions[self.rank]:
            chunk = self.split.stage_chunk(a.stage)
            self.p2p.prefetch()
            before = self.rec.memory()
            start: list[Any] = []
            self.rec.begin_op()
            label = f"{a.kind}{a.microbatch} (stage {a.stage}) of iteration {iteration}"
            progress.RANK.start(label)
            try:
                f = self.fault
                if f is not None and (f.rank, f.kind, f.stage, f.microbatch, f.iteration) == (
                        self.rank, a.kind, a.stage, a.microbatch, iteration):
                    raise RuntimeError("injected fault (--inject-fault)")
                run[a.kind](a, start)
            except Exception as exc:
                raise OpFailed(self.rank, a, chunk, iteration, exc) from exc
            self.rec.op(start[0], self.rec.mark(), a.kind, a.stage, chunk, a.microbatch,
                        before, self.rec.memory())
            progress.RANK.finish(label)
        self.p2p.finish()
        sum_partial_grads(self.params)
        if self.tied is not None:  # the tied table's copies, before the replicas reduce
            self._step_op("R", self.tied.reduce)
        if self.replica.size > 1 or self.replica.expert_replicas > 1:  # experts apart: their
            # ranks may be tensor ranks of one replica
            self._step_op("R", self.dp.reduce)
        if dump_grads:
            grads = self.dp.reduced_grads()
            torch.save({"loss": self.loss.item(),
                        "grads": {n: g.detach().cpu().clone()
                                  for n, g in zip(self.names, grads, strict=True)}},
                       f"{dump_grads}.rank{self.replica.global_rank(self.rank, self.schedule.pp)}"
                       ".pt")
        self._step_op("S", self.dp.step)
        if self.dp.gathers:  # the sharded weights (dp > 1)
            self._step_op("R", self.dp.gather)
        set_sink(None)
        self.rec.end_iteration()
        self._batches, self._prepared = [], -1

    def global_loss(self) -> float:
        """The last step's loss over the global batch (the loss all-reduce that ends an
        iteration; only the ranks holding the head contribute)."""
        total = self.loss.detach().to(self.p2p.wire)
        dist.all_reduce(total)  # every tensor-parallel rank of the head holds the loss
        return float(total.item()) / self.replica.size / self.replica.tp

    def _step_op(self, kind: str, fn: Any) -> None:
        """An op of the whole step (R: the gradients' reduce or the weights' gather, S: the
        optimizer step), on the compute lane."""
        self.rec.step_op(kind, fn, self._static_bytes)
