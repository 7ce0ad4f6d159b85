"""Routed experts as Megatron's MoE layer runs them, dropless: the router's top-k, the
pairs sorted by expert into one grouped GEMM (gate and up, the activation, down), their
routing probabilities weighing the activation (TEGroupedMLP; torchtitan's FSDP path
weighs the outputs instead), and the shared experts beside them, gated or not.

At tp > 1 (sequence parallel) each rank routes its own tokens, but under torchtitan's
without expert parallelism (`MoE._gathered_forward`): there every rank routes the
gathered tokens through its slice of each expert. With each expert whole on
every rank (etp 1) its pairs go through all the experts, whose gradients are then partial
sums. With the experts split over etp ranks (the tensor ranks at etp = tp, Megatron's
default; else etp consecutive ranks of the folded expert layout,
ppsim.executor.places) the dispatcher all-gathers every one of those ranks' pairs and
their probabilities, each rank runs them through its slice of every expert's units (gate
and up by columns, down by rows), and the partial outputs are reduce-scattered back to
the ranks that routed them (Megatron's token dispatcher over the expert tensor group).

Under expert parallelism (ep > 1) a rank keeps E / ep experts; its pairs, sorted by
expert and so by the rank holding it, go there and their outputs come back by two
all-to-alls (Megatron's all-to-all dispatcher), the probabilities with them. With the
experts also split (etp > 1), the pairs a rank received are then gathered over its
expert tensor group and run through its slice of each of its experts, as at ep 1 (the
dispatcher's all-to-all over ep, then its all-gather over the expert tensor group).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppsim.executor.builders.comm_clock import timed
from ppsim.executor.builders.common import MLP, swiglu
from ppsim.executor.builders.deferral import segmented_mm
from ppsim.executor.builders.tensor import (
    ALL_GATHER,
    REDUCE_SCATTER,
    ExpertGroup,
    TensorGroup,
    mark_partial,
    reduce_out,
    tokens_in,
)

if TYPE_CHECKING:
    from ppsim.executor.builders.llama import LlamaShape

Experts = Callable[[torch.Tensor, list[int], "torch.Tensor | None"], torch.Tensor]
"""Pairs sorted by expert (`counts` of each), their probabilities: the experts' outputs."""


class GatedSharedExperts(MLP):
    """The shared experts times a per-token sigmoid gate (Megatron's
    --moe-shared-expert-gate): their output and the score kept for the product."""

    def __init__(self, hidden: int, ffn: int, gated: bool = True,
                 keep_silu: bool = False) -> None:
        super().__init__(hidden, ffn, gated, keep_silu)
        self.gate_weight = nn.Parameter(torch.empty(1, hidden).normal_(0.0, 0.02))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * torch.sigmoid(F.linear(x, self.gate_weight))


class ExpertsFC1(nn.Module):
    """The experts' first matmuls (gate and up) as a piece of their own, Megatron's
    `expert_fc1`: what offloading it moves is the dispatched pairs they keep. It holds
    no parameters: the MoE passes its expert stacks in."""

    def forward(self, pairs: torch.Tensor, counts: list[int], up: torch.Tensor,
                gate: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return (segmented_mm(pairs, up, counts),
                None if gate is None else segmented_mm(pairs, gate, counts))


class WeightedSwiGLUFn(torch.autograd.Function):
    """silu(gate) * up * p, p a pair's routing probability, as Megatron's fused
    weighted_bias_swiglu computes it: the two inputs and the fp32 probabilities kept,
    the rest recomputed in the backward."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor,
                probs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up, probs)
        return F.silu(gate) * up * probs.to(gate.dtype)[:, None]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gate, up, probs = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        gp = g * probs.to(g.dtype)[:, None]
        wide = torch.promote_types(g.dtype, probs.dtype)  # fp32 at least, as the probabilities
        d_probs = (g.to(wide) * (silu * up).to(wide)).sum(-1).to(probs.dtype)
        return gp * up * sig * (1 + gate * (1 - sig)), gp * silu, d_probs


class ExpertsAct(nn.Module):
    """The experts' activation (SwiGLU, or GELU) as a piece of its own, Megatron's
    `moe_act`: recomputing it frees its output, offloading it moves its inputs. Given
    each pair's routing probability it weighs the activation by it, as Megatron's
    TEGroupedMLP does: fused into the SwiGLU, else an eager product that keeps its
    unweighted factor."""

    def __init__(self, keep_silu: bool = False) -> None:
        super().__init__()
        self.keep_silu = keep_silu

    def forward(self, up: torch.Tensor, gate: torch.Tensor | None,
                probs: torch.Tensor | None = None) -> torch.Tensor:
        if probs is not None and gate is not None and not self.keep_silu:
            return WeightedSwiGLUFn.apply(gate, up, probs)
        act = F.gelu(up) if gate is None else swiglu(gate, up, self.keep_silu)
        return act if probs is None else (act * probs[:, None]).to(act.dtype)


def _regrouped(rows: torch.Tensor, counts: list[list[int]], by_expert: bool) -> torch.Tensor:
    """Rows in rank-major chunks (each rank's pairs sorted by expert: counts[r][e] rows of
    expert e from rank r) put expert-major (every rank's pairs of expert 0, then 1, ...),
    or back. A concatenation: its backward keeps nothing."""
    ranks, experts = len(counts), len(counts[0])
    if by_expert:
        chunks = rows.split([c for row in counts for c in row])
        return torch.cat([chunks[r * experts + e] for e in range(experts) for r in range(ranks)])
    chunks = rows.split([counts[r][e] for e in range(experts) for r in range(ranks)])
    return torch.cat([chunks[e * ranks + r] for r in range(ranks) for e in range(experts)])


def _gather_pairs(x: torch.Tensor, g: TensorGroup, counts: list[list[int]]) -> torch.Tensor:
    """Every rank's pairs (counts[r] of rank r's: as many at ep 1, what the all-to-alls
    brought it under ep; padded to the most for the collective), expert-major."""
    rows = [sum(row) for row in counts]
    most = max(rows)
    if most == 0:  # no rank has a pair for these experts (every rank sees so)
        return x[:0].clone()
    padded = F.pad(x, (0, 0) * (x.dim() - 1) + (0, most - x.shape[0]))
    out = x.new_empty((most * g.size, *x.shape[1:]))
    with timed("tp"):  # the expert tensor group's, in the simulator's tp lane
        ALL_GATHER(out, padded.contiguous(), group=g.group)
    ranks = [part[:n] for part, n in zip(out.split(most), rows, strict=True)]
    return _regrouped(torch.cat(ranks), counts, by_expert=True)


def _scatter_pairs(y: torch.Tensor, g: TensorGroup, counts: list[list[int]]) -> torch.Tensor:
    """This rank's pairs of the expert-major rows `y`, summed over the ranks."""
    rows = [sum(row) for row in counts]
    most = max(rows)
    if most == 0:
        return y[:0].clone()
    whole = _regrouped(y, counts, by_expert=False)
    parts = [F.pad(part, (0, 0) * (y.dim() - 1) + (0, most - n))
             for part, n in zip(whole.split(rows), rows, strict=True)]
    out = y.new_empty((most, *y.shape[1:]))
    with timed("tp"):
        REDUCE_SCATTER(out, torch.cat(parts), group=g.group)
    return out[:rows[g.rank]]


class _PairExchange(torch.autograd.Function):
    """The dispatcher's all-gather of the pairs over the expert tensor group (its backward
    the reduce-scatter of their gradients), or the combine's reduce-scatter of the
    experts' partial outputs (its backward the all-gather)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: TensorGroup, counts: list[list[int]],
                gather: bool) -> torch.Tensor:
        ctx.g, ctx.counts, ctx.gather = g, counts, gather
        return (_gather_pairs if gather else _scatter_pairs)(x, g, counts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        back = _scatter_pairs if ctx.gather else _gather_pairs
        return back(grad, ctx.g, ctx.counts), None, None, None


def _every_ranks_counts(counts: list[int], g: TensorGroup, device: torch.device
                        ) -> list[list[int]]:
    """Each rank's pairs per expert, in rank order (on the device: NCCL takes no host
    tensor)."""
    mine = torch.tensor(counts, dtype=torch.int64, device=device)
    out = mine.new_empty(mine.numel() * g.size)
    with timed("tp"):
        ALL_GATHER(out, mine, group=g.group)
    return out.view(g.size, -1).tolist()


class _AllToAll(torch.autograd.Function):
    """Rows sent to the expert-parallel ranks (`sent[r]` of them to rank r, in rank order)
    and received from them (`got[r]`); the gradients go back the other way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: ExpertGroup, sent: list[int],
                got: list[int]) -> torch.Tensor:
        ctx.g, ctx.sent, ctx.got = g, sent, got
        return _exchanged_rows(x, g, sent, got)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _exchanged_rows(grad, ctx.g, ctx.got, ctx.sent), None, None, None


def _exchanged_rows(x: torch.Tensor, g: ExpertGroup, sent: list[int], got: list[int]
                    ) -> torch.Tensor:
    out = x.new_empty((sum(got), *x.shape[1:]))
    with timed("ep"):
        dist.all_to_all_single(out, x.contiguous(), got, sent, group=g.group)
    return out


def _dispatch_counts(counts: list[int], g: ExpertGroup, device: torch.device
                     ) -> list[list[int]]:
    """From each expert-parallel rank, its pairs for each of this rank's experts."""
    mine = torch.tensor(counts, dtype=torch.int64, device=device)
    out = torch.empty_like(mine)
    with timed("ep"):
        dist.all_to_all_single(out, mine, group=g.group)
    return out.view(g.size, -1).tolist()


class MoE(nn.Module):
    """Top-k routed experts as a dropless grouped GEMM, plus the shared experts."""

    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        a = s.arch
        h, f, e = a.hidden_size, a.moe_ffn_hidden_size, a.num_experts
        self.top_k = min(a.top_k, e)
        self.gated = a.gated_mlp
        self.router = nn.Linear(h, e, bias=False)
        self.gate = nn.Parameter(torch.empty(e, h, f)) if a.gated_mlp else None
        self.up = nn.Parameter(torch.empty(e, h, f))
        self.down = nn.Parameter(torch.empty(e, f, h))
        shared = GatedSharedExperts if a.shared_expert_gate else MLP
        self.shared = shared(h, a.shared_width, a.gated_mlp,
                             a.swiglu_keeps_silu) if a.shared_width else None
        self.fc1 = ExpertsFC1()
        self.act = ExpertsAct(a.swiglu_keeps_silu)
        self.probs_in_activation = a.probs_in_activation
        self.expert_tp = a.expert_tp
        self.expert_tensor: TensorGroup | None = None
        """The ranks each routed expert is split over (etp > 1); None: whole."""
        self.ep: ExpertGroup | None = None
        self.tp: TensorGroup | None = None

    def place_experts(self, ep: ExpertGroup | None, split: TensorGroup | None,
                      apart: bool) -> None:
        """Keep this rank's slice of each expert's units over `split` (the expert tensor
        group) and its E / ep routed experts over `ep` (the router stays whole: every
        rank routes its tokens to all E); `apart`: their gradients reduce over their own
        group (ppsim.executor.dataparallel.ExpertsApart)."""
        if split is not None:
            self.expert_tensor = split
            self._keep_slices((2, 2, 1), split.size, split.rank, expert_parallel=apart)
        if ep is not None:
            self.ep = ep
            self._keep_slices((0, 0, 0), ep.size, ep.rank, expert_parallel=True)

    def _keep_slices(self, dims: tuple[int, int, int], size: int, rank: int,
                     expert_parallel: bool = False) -> None:
        """Keep slice `rank` of `size` of the gate, up and down stacks along `dims`
        (experts: 0; an expert's units: 2, 2, 1); `expert_parallel` marks them for their
        own gradient reduction (ppsim.executor.dataparallel.ExpertsApart)."""
        with torch.no_grad():
            for name, dim in zip(("gate", "up", "down"), dims, strict=True):
                p = getattr(self, name)
                if p is not None:
                    part = nn.Parameter(p.chunk(size, dim)[rank].clone(
                        memory_format=torch.contiguous_format))
                    part.expert_parallel = expert_parallel  # type: ignore[attr-defined]
                    setattr(self, name, part)

    def shard(self, g: TensorGroup) -> None:
        """Under sequence parallelism: the router (and the shared experts' gate) applied to
        this rank's tokens, their gradients partial sums; the shared experts a
        tensor-parallel MLP (Megatron's SharedExpertMLP); the routed experts whole at
        etp 1 (their gradients partial too), else split by `place_experts`."""
        assert g.sequence_parallel, "Megatron's MoE layer needs sequence parallelism"
        self.tp = g
        if self.shared is not None:
            self.shared.shard(g)
        mark_partial(self.router, getattr(self.shared, "gate_weight", None))
        if self.expert_tp == 1:
            mark_partial(self.gate, self.up, self.down)

    def _experts(self, pairs: torch.Tensor, counts: list[int],
                 probs: torch.Tensor | None) -> torch.Tensor:
        up, gate = self.fc1(pairs, counts, self.up, self.gate)
        return segmented_mm(self.act(up, gate, probs), self.down, counts)

    def _held_experts(self, pairs: torch.Tensor, counts: list[int],
                      probs: torch.Tensor | None) -> torch.Tensor:
        """The pairs (sorted by expert, `counts` of each this rank holds) through its
        experts: whole, or its slice of each over the expert tensor group (etp > 1)."""
        if self.expert_tensor is None:
            return self._experts(pairs, counts, probs)
        return self._split_experts(pairs, counts, probs, self.expert_tensor)

    def _split_experts(self, pairs: torch.Tensor, counts: list[int],
                       probs: torch.Tensor | None, g: TensorGroup) -> torch.Tensor:
        """Every tensor rank's pairs (and probabilities) gathered, run through this rank's
        slice of each expert, the partial outputs of this rank's pairs summed back."""
        every = _every_ranks_counts(counts, g, pairs.device)
        gathered = _PairExchange.apply(pairs, g, every, True)
        if probs is not None:
            probs = _PairExchange.apply(probs, g, every, True)
        per_expert = [sum(col) for col in zip(*every, strict=True)]
        y = self._experts(gathered, per_expert, probs)
        return _PairExchange.apply(y, g, every, False)

    def _dispatched_experts(self, pairs: torch.Tensor, counts: list[int],
                            probs: torch.Tensor | None, g: ExpertGroup) -> torch.Tensor:
        """The pairs (sorted by expert, so by the rank that holds it) sent to their
        experts' ranks, run through this rank's experts, the outputs sent back (Megatron's
        all-to-all dispatcher)."""
        local = len(counts) // g.size
        sent = [sum(counts[r * local:(r + 1) * local]) for r in range(g.size)]
        every = _dispatch_counts(counts, g, pairs.device)
        got = [sum(row) for row in every]
        rows = _regrouped(_AllToAll.apply(pairs, g, sent, got), every, by_expert=True)
        if probs is not None:
            probs = _regrouped(_AllToAll.apply(probs, g, sent, got), every, by_expert=True)
        y = self._held_experts(rows, [sum(col) for col in zip(*every, strict=True)], probs)
        return _AllToAll.apply(_regrouped(y, every, by_expert=False), g, got, sent)

    def _routes_gathered(self) -> bool:
        """torchtitan's MoE without expert parallelism at tp > 1 (its experts split over
        the tensor group): every tensor rank routes the block's gathered tokens
        (Architecture.routes_gathered_tokens)."""
        g = self.tp
        return g is not None and g.sequence_parallel and g.saves_gathered \
            and self.ep is None and self.expert_tensor is g

    def _routed(self, tokens: torch.Tensor, run: Experts) -> torch.Tensor:
        """The routed experts' output of (n, h) `tokens`: the router's top-k, the pairs
        sorted by expert through `run`, weighed and summed back per token."""
        n, h = tokens.shape
        e = self.router.out_features  # all E, whatever this rank holds
        probs = torch.softmax(self.router(tokens).float(), dim=-1)
        weight, expert = torch.topk(probs, self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)  # fp32
        flat = expert.reshape(-1)  # (n * k,) expert of each (token, slot)
        order = torch.argsort(flat, stable=True)  # the pairs grouped by expert
        counts = torch.bincount(flat, minlength=e).tolist()
        inside = weight.reshape(-1)[order] if self.probs_in_activation else None
        y = run(tokens[order // self.top_k], counts, inside)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=tokens.device)
        y = y[back]
        if inside is None:  # torchtitan: the scores weigh the experts' outputs
            y = y * weight.to(tokens.dtype).reshape(-1, 1)
        return y.view(n, self.top_k, h).sum(1)

    def _own_tokens_experts(self, pairs: torch.Tensor, counts: list[int],
                            probs: torch.Tensor | None) -> torch.Tensor:
        if self.ep is not None:
            return self._dispatched_experts(pairs, counts, probs, self.ep)
        return self._held_experts(pairs, counts, probs)

    def _gathered_forward(self, x: torch.Tensor, g: TensorGroup) -> torch.Tensor:
        """torchtitan's (moe_sharding.py): the block's input gathered (Shard(1) ->
        Replicate), routed whole on every rank through its slice of each expert and of
        the shared experts, the partial sums reduce-scattered back (Partial -> Shard(1));
        the router's gradients partial sums."""
        whole = tokens_in(x, g)
        b, t, h = whole.shape
        out = self._routed(whole.reshape(-1, h), self._experts)
        if self.shared is not None:
            out = out + _partial_mlp(self.shared, whole).reshape(-1, h)
        return reduce_out(out.view(b, t, h), g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp is not None and self._routes_gathered():
            return self._gathered_forward(x, self.tp)
        b, t, h = x.shape
        out = self._routed(x.reshape(-1, h), self._own_tokens_experts)
        if self.shared is not None:
            out = out + self.shared(x).reshape(-1, h)  # (b, s, h): a tensor-parallel MLP
        return out.view(b, t, h)


def _partial_mlp(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel MLP's partial output (its units of this rank's) of an input whole
    on every rank, gated where it has a gate (GatedSharedExperts): no collective."""
    ups = [F.linear(x, lin.weight) for lin in (mlp.gate, mlp.up) if lin is not None]
    y = F.gelu(ups[0]) if mlp.gate is None else swiglu(ups[0], ups[1], mlp.keep_silu)
    out = F.linear(y, mlp.down.weight)
    gate = getattr(mlp, "gate_weight", None)
    return out if gate is None else out * torch.sigmoid(F.linear(x, gate))


def init_experts(moe: MoE, num_layers: int) -> None:
    """Expert stacks initialised like their Linears (init_normal skips raw parameters)."""
    with torch.no_grad():
        for p in (moe.gate, moe.up):
            if p is not None:
                p.normal_(0.0, 0.02)
        moe.down.normal_(0.0, 0.02 / math.sqrt(2 * num_layers))
