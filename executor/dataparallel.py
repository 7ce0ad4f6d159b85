"""A rank's weights and gradients across its data-parallel replicas, and their step.

Two ways, as the config's `distributed_optimizer` says, so a run does what `simulate`
prices:

- DDP (`Replicated`): one flat gradient buffer, all-reduced and averaged after the
  last backward (R); AdamW on every parameter (S).
- torchtitan's FSDP with pipeline parallelism (`FullyShardedPipelined`): Sharded with an
  fp32 shard of its own and its gradient's shard kept (ppsim.job.fsdp's accounting).
- Megatron's distributed optimizer (`Sharded`): weights and gradients in flat buffers
  padded to a multiple of dp; the gradients reduce-scattered and averaged (R); AdamW
  on this rank's 1 / dp of them, in fp32 (a master copy where the model trains in a
  lower precision), its moments for that shard alone (S); the updated weights
  all-gathered (a second R after the S: the model prices both collectives as the
  step's reduce). AdamW is elementwise, so the shards step exactly as the whole.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ppsim.executor.builders.tensor import ALL_GATHER, REDUCE_SCATTER
from ppsim.executor.optim import FusedAdamW, Optimizers, adamw, optimizer


def _on(t: torch.Tensor, wire: torch.device) -> torch.Tensor:
    return t if t.device == wire else t.to(wire)


def _views(flat: torch.Tensor, params: list[nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's place in `flat`, end to end, shaped as the parameter."""
    out, at = [], 0
    for p in params:
        out.append(flat[at:at + p.numel()].view_as(p))
        at += p.numel()
    return out


def optimizer_state(optimizer: FusedAdamW | Optimizers | None) -> list[torch.Tensor]:
    return [] if optimizer is None else [
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


class Replicated:
    """DDP: each rank keeps every weight and its optimizer's state (Adam's; Muon's on the
    `muon` weights); gradients all-reduced."""

    gathers = False
    """No weights to gather after the step: every rank stepped them all."""

    def __init__(self, params: list[nn.Parameter], device: torch.device, lr: float,
                 group: Any = None, size: int = 1, wire: torch.device | None = None,
                 muon: list[nn.Parameter] | None = None, average: int = 0) -> None:
        self.params, self.group, self.size = params, group, size
        self.average = average or size
        """The replicas the gradients average over (all of them, for experts that reduce
        over a part: Megatron's expert gradient scaling)."""
        self.wire = wire or device
        dtype = params[0].dtype if params else torch.float32
        self.grads = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=device)
        """The flat gradient buffer every p.grad views (one collective, no copies)."""
        for p, grad in zip(params, _views(self.grads, params), strict=True):
            p.grad = grad
        self.optimizer: FusedAdamW | Optimizers | None = \
            optimizer(params, lr, muon or ()) if params else None

    def reduce(self) -> None:
        """Sum the gradients over the replicas, then average."""
        if self.size > 1:
            buf = _on(self.grads, self.wire)
            dist.all_reduce(buf, group=self.group)
            if buf is not self.grads:
                self.grads.copy_(buf)
        self.grads.div_(self.average)

    def step(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
        self.grads.zero_()  # the flat buffer every p.grad views: one pass

    def gather(self) -> None:
        """Nothing to gather (gathers is False)."""

    def reduced_grads(self) -> list[torch.Tensor]:
        """Each parameter's gradient after reduce()."""
        return [p.grad for p in self.params]

    def static_tensors(self) -> list[torch.Tensor]:
        """What the rank keeps between steps: weights, gradients, Adam's state."""
        return [*self.params, self.grads, *optimizer_state(self.optimizer)]


class Sharded:
    """Megatron's distributed optimizer over `size` replicas, this one `index`."""

    gathers = True
    owns_shard = False
    """The shard's fp32 weights and its gradient are tensors of their own (FSDP), not
    views of the flat buffers where the model trains in fp32."""

    def __init__(self, params: list[nn.Parameter], device: torch.device, lr: float,
                 group: Any, size: int, index: int, wire: torch.device | None = None,
                 average: int = 0) -> None:
        self.params, self.group, self.size = params, group, size
        self.average = average or size
        self.wire = wire or device
        padded = -(-sum(p.numel() for p in params) // size) * size
        self.shard = slice(index * padded // size, (index + 1) * padded // size)
        """This rank's part of the flat buffers: the weights it steps."""
        dtype = params[0].dtype if params else torch.float32
        self.weights = torch.zeros(padded, dtype=dtype, device=device)
        self.grads = torch.zeros(padded, dtype=dtype, device=device)
        with torch.no_grad():
            for p, weight, grad in zip(params, _views(self.weights, params),
                                       _views(self.grads, params), strict=True):
                p.data, p.grad = weight.copy_(p), grad
        mine = self.weights[self.shard]
        # fp32 training steps its own weights; a lower precision keeps an fp32 master.
        self.main = nn.Parameter(mine.float() if dtype != torch.float32
                                 else mine.clone() if self.owns_shard else mine)
        self.optimizer = adamw([self.main], lr) if params else None
        self.reduced = torch.zeros_like(self.main) if self.owns_shard else self.grads[self.shard]
        """Where reduce() leaves this rank's averaged gradient shard."""

    @property
    def _own_master(self) -> bool:
        return self.main.data_ptr() != self.weights[self.shard].data_ptr()

    def reduce(self) -> None:
        """Reduce-scatter the gradients: this rank's shard summed over the replicas,
        averaged (Megatron reduces into the buffer in place; gloo takes a separate output).
        A pipeline position without weights has no collective: its peers hold none either."""
        if not self.params:
            return
        grads = _on(self.grads, self.wire)
        out = torch.empty(grads.numel() // self.size, dtype=grads.dtype, device=grads.device)
        REDUCE_SCATTER(out, grads, group=self.group)
        self.reduced.copy_(out).div_(self.average)

    def step(self) -> None:
        if self.optimizer is not None:
            grad = self.reduced
            self.main.grad = grad if grad.dtype == self.main.dtype else grad.float()
            self.optimizer.step()
            self.main.grad = None
            if self._own_master:
                with torch.no_grad():
                    self.weights[self.shard].copy_(self.main)
        self.grads.zero_()

    def gather(self) -> None:
        """All-gather the stepped shards into every rank's weights."""
        if not self.params:
            return
        weights = _on(self.weights, self.wire)
        ALL_GATHER(weights, weights[self.shard].clone(), group=self.group)
        if weights is not self.weights:
            self.weights.copy_(weights)

    def reduced_grads(self) -> list[torch.Tensor]:
        """Each parameter's averaged gradient after reduce(), the shards all-gathered into
        a copy (for --dump-grads: a rank of Megatron's holds its own shard alone)."""
        if not self.params:
            return []
        whole = _on(self.grads, self.wire).clone()
        whole[self.shard].copy_(self.reduced)
        ALL_GATHER(whole, whole[self.shard].clone(), group=self.group)
        return _views(whole, self.params)

    def static_tensors(self) -> list[torch.Tensor]:
        """Weights and gradients whole; the fp32 master and Adam's moments of the shard."""
        master = [self.main] if self._own_master else []
        return [self.weights, self.grads, *master, *optimizer_state(self.optimizer)]


class FullyShardedPipelined(Sharded):
    """torchtitan's FSDP2 with pipeline parallelism (ppsim.job.fsdp): the shards hold the
    fp32 weights, their gradients and Adam's moments; the weights gathered for the step's
    forwards and their accumulated gradients are held whole until the reduce-scatter
    after the last backward (torch.distributed.pipelining syncs once a step). The gather
    runs after the step, unhidden: torchtitan's runs during the next first forward, unit
    by unit behind its compute, and the model prices only what that leaves exposed."""

    owns_shard = True

    def static_tensors(self) -> list[torch.Tensor]:
        """The whole weights and gradients held for the step; the fp32 shard, its
        gradient and Adam's moments."""
        return [*super().static_tensors(), self.reduced]


def data_parallel(params: list[nn.Parameter], device: torch.device, lr: float, *,
                  sharded: bool, group: Any = None, size: int = 1, index: int = 0,
                  wire: torch.device | None = None, fully_sharded: bool = False,
                  muon: list[nn.Parameter] | None = None, average: int = 0
                  ) -> Replicated | Sharded:
    """The config's way with dp > 1: FSDP's pipelined form (`fully_sharded`), Sharded
    under the distributed optimizer, else DDP."""
    if fully_sharded and size > 1:
        return FullyShardedPipelined(params, device, lr, group, size, index, wire, average)
    if sharded and size > 1:
        return Sharded(params, device, lr, group, size, index, wire, average)
    return Replicated(params, device, lr, group, size, wire, muon, average)


class ExpertsApart:
    """Under expert parallelism: the dense weights over every replica, the routed experts
    over the ranks that hold the same ones (their gradients, each whole from its ranks'
    tokens, averaged over every replica all the same), each its own buffers and
    collectives."""

    def __init__(self, dense: Replicated | Sharded, experts: Replicated | Sharded,
                 params: list[nn.Parameter]) -> None:
        self.parts = (dense, experts)
        self.params = params
        self.gathers = dense.gathers or experts.gathers

    def reduce(self) -> None:
        for part in self.parts:
            part.reduce()

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def gather(self) -> None:
        for part in self.parts:
            if part.gathers:
                part.gather()

    def reduced_grads(self) -> list[torch.Tensor]:
        """Each parameter's averaged gradient, in the order of `params`."""
        by_param = {id(p): g for part in self.parts
                    for p, g in zip(part.params, part.reduced_grads(), strict=True)}
        return [by_param[id(p)] for p in self.params]

    def static_tensors(self) -> list[torch.Tensor]:
        return [t for part in self.parts for t in part.static_tensors()]


def replica_data_parallel(params: list[nn.Parameter], device: torch.device, lr: float,
                          replica: Any, wire: torch.device | None = None,
                          muon: list[nn.Parameter] | None = None
                          ) -> Replicated | Sharded | ExpertsApart:
    """The rank's weights over its replicas (ppsim.executor.runtime.Replica): as
    data_parallel, the routed experts apart under expert parallelism."""
    kw = {"sharded": replica.sharded, "fully_sharded": replica.fully_sharded, "wire": wire}
    if not replica.experts_apart:
        return data_parallel(params, device, lr, group=replica.group, size=replica.size,
                             index=replica.index, muon=muon, **kw)
    experts = [p for p in params if getattr(p, "expert_parallel", False)]
    dense = [p for p in params if not getattr(p, "expert_parallel", False)]
    dense_ids = {id(p) for p in dense}
    return ExpertsApart(
        data_parallel(dense, device, lr, group=replica.group, size=replica.size,
                      index=replica.index, muon=[p for p in muon or () if id(p) in dense_ids],
                      **kw),
        data_parallel(experts, device, lr, group=replica.expert_group,
                      size=replica.expert_replicas, index=replica.expert_index,
                      average=replica.size, **kw), params)
