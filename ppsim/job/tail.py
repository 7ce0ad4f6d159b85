"""The step's tail of one rank in a data-parallel job: gradient reduction, parameter
gather and the optimizer, only the part nothing hides.

Megatron's DDP reduces gradients over the dp x cp group in buckets of
max(40M, 1M x dp x cp) parameters (megatron/core/distributed/distributed_data_parallel.py).
With the distributed optimizer it reduce-scatters the fp32 gradients and, after each
rank steps its 1 / (dp x cp) shard, all-gathers the bf16 parameters; without it, one
all-reduce. --overlap-grad-reduce launches each bucket as the last microbatch's
backward finishes it: what outlasts that backward is exposed, and never less than the
last bucket. --overlap-param-gather gathers during the next forward the same way.
--overlap-param-gather-with-optimizer-step (interleaved schedules) steps the first model
chunk's optimizer first and gathers that chunk's parameters, one bucket, beside the
other chunks' steps; the other chunks gather one ahead of their forwards, from the
first forward on, so no bucket waits whole at the start; the first chunk's gradients,
unbucketed too, are reduced last.
What they hide still holds NCCL's SMs from the compute beside them (Job.collective_sm_share).
Buckets fill in reverse order of the forward and close once they reach the bucket size,
so the rank holding the embedding has it in the bucket reduced last and gathered first:
that bucket is at least the embedding's own parameters (131,072 x 2,048 = 268M for
Megatron's 1.7B GPT, beside 40M buckets), and nothing hides it. Only pipeline rank 0 is
bucketed; elsewhere each chunk is one bucket, the first chunk's last (FirstChunk). Under
FSDP the tail holds what FSDP runs once a step (ppsim.job.fsdp) and the optimizer on the
rank's shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ppsim.costs.arch import DTYPE_BYTES
from ppsim.costs.fp8 import gathered_weight_bytes
from ppsim.costs.muon import muon_step_ms
from ppsim.costs.state import adam_step_bytes, grad_bytes
from ppsim.job import fsdp
from ppsim.job.collectives import (
    all_gather_ms,
    all_reduce_ms,
    behind_compute_ms,
    sharded_reduce_ms,
    unhidden_ms,
)
from ppsim.job.host_optimizer import host_state_bytes
from ppsim.job.step_comm import Reduction, StepCollective, overlapped

if TYPE_CHECKING:
    from ppsim.job.model import Job


@dataclass(frozen=True, kw_only=True)
class Tail:
    """One rank's step after its last backward, ms."""

    reduce_ms: float
    """Exposed gradient reduction and parameter gather, and what their kernels' SMs
    cost the compute they run beside."""
    optimizer_ms: float
    """AdamW on the rank's (shard of its) parameters."""
    host_bytes: float = 0.0
    """The optimizer's state the host holds for the rank (ppsim.job.host_optimizer)."""
    on_links: tuple[StepCollective, ...] = ()
    """The gradient reduction and the parameter gather as they run on the links (under
    FSDP those it runs once a step; its units' run in their ops)."""


@dataclass(frozen=True, kw_only=True)
class FirstChunk:
    """A pipeline rank's first model chunk, on a rank Megatron does not bucket: its DDP
    splits gradients into buckets on pipeline rank 0's first chunk alone (elsewhere
    "data-parallel communication ... is not on the critical path",
    distributed_data_parallel.py), so each chunk there is one bucket, and the first
    chunk's, whose backward ends last, waits whole."""

    dense: int
    """Its parameters but the routed experts'."""
    experts: int
    """Its routed experts' parameters (their own buffer, one bucket too)."""
    whole: bool
    """The rank's only chunk (its embedding or output layer in it)."""


def first_chunk(stage_ranks: Sequence[int], costs: Sequence[Any], rank: int,
                every_rank: bool = False) -> FirstChunk | None:
    """The first chunk `rank` holds (stage i on rank stage_ranks[i], costs[i] its
    params and expert_params); None on the first pipeline rank, which buckets, unless
    `every_rank` (--overlap-param-gather-with-optimizer-step: no chunk is bucketed)."""
    if not stage_ranks or (rank == stage_ranks[0] and not every_rank):
        return None
    mine = [i for i, r in enumerate(stage_ranks) if r == rank]
    c = costs[mine[0]]
    return FirstChunk(dense=c.params - c.expert_params, experts=c.expert_params,
                      whole=len(mine) == 1)


def bucket_params(job: Job, params: int) -> int:
    """Parameters per bucket of a rank holding `params`, as Megatron resolves it
    (megatron/training/training.py, resolve_ddp_bucket_size)."""
    if job.ddp_num_buckets is not None:
        return max(1, params // job.ddp_num_buckets)
    if job.ddp_bucket_size is not None:
        return job.ddp_bucket_size
    return max(40_000_000, 1_000_000 * job.groups.dp.size)


def edge_params(job: Job, holds_embedding: bool, holds_head: bool) -> int:
    """Of a rank's parameters, the word embedding's and the output layer's (one tied
    weight where a rank holds both)."""
    both = holds_embedding and holds_head and job.arch.tie_embeddings
    return job.embedding_params * (int(holds_embedding) + int(holds_head and not both))


def rank_tail(job: Job, params: int, forward_ms: float, backward_ms: float,
              memory_bandwidth_gbps: float, optimizer_fixed_ms: float = 0.0,
              holds_embedding: bool = False, expert_params: int = 0,
              holds_head: bool = False, unbucketed: FirstChunk | None = None) -> Tail:
    """The tail of a rank holding `params` (`expert_params` of them routed experts')
    whose one microbatch takes forward_ms and backward_ms (the windows the overlaps hide
    in); `holds_embedding`: the rank of the first stage, whose exposed bucket is the
    embedding's; `holds_head`: of the last. Dense gradients reduce over dp x cp, the
    experts' over the expert data-parallel group, each buffer in its own collectives,
    one after the other. Under --fp8-param-gather the layers' weights gather in FP8, the
    embedding's and the output layer's in the training dtype (ppsim.costs.fp8; layers
    --first-last-layers-bf16 keeps in bf16 are counted as FP8 here, a layer or two).
    `unbucketed`: on pipeline ranks but the first (on every rank under
    --overlap-param-gather-with-optimizer-step), the first chunk, whose whole gradients
    are the last bucket (FirstChunk)."""
    dense = params - expert_params
    named = [(n, g) for n, g in ((dense, "dp"), (expert_params, "edp")) if n]
    embedding = job.embedding_params if holds_embedding else 0  # in the first bucket
    edge = max(bucket_params(job, params), embedding)
    # The bucket reduced last (and gathered first) is the dense buffer's: it holds the
    # embedding, the first layers' attention and norms.
    last_n, last_g = named[0] if named else (0, "dp")
    bucket = min(last_n, edge)
    grads = grad_bytes(job.arch)
    edges = edge_params(job, holds_embedding, holds_head)
    step = step_ms(job, dense, expert_params, edges, memory_bandwidth_gbps)
    if params and (step or optimizer_fixed_ms):
        step += optimizer_fixed_ms
    if job.arch.fsdp:
        reduction = fsdp.step_reduction(job, params, expert_params, forward_ms,
                                        holds_embedding, edges)
    elif job.arch.distributed_optimizer:
        reduction = _sharded_reduce(job, named, forward_ms, backward_ms, step, unbucketed,
                                    FirstBucket(params=bucket, group=last_g,
                                                embedding=embedding, edges=edges))
    else:
        ar = sum(all_reduce_ms(n * grads, job.link(g)) for n, g in named)
        last_ar = all_reduce_ms(bucket * grads, job.link(last_g)) if unbucketed is None else \
            sum(all_reduce_ms(n * grads, job.link(g)) for n, g in
                ((unbucketed.dense, "dp"), (unbucketed.experts, "edp")) if n)
        reduction = overlapped("gradient all-reduce", ar, last_ar, backward_ms,
                               job.overlap_grad_reduce, job.collective_sm_share, "backward",
                               sum(n * grads for n, _ in named))
    return Tail(reduce_ms=reduction.cost_ms, optimizer_ms=step,
                host_bytes=host_state_bytes(job.arch, dense, expert_params),
                on_links=tuple(c for c in reduction.on_links if c.total_ms > 0))


@dataclass(frozen=True, kw_only=True)
class FirstBucket:
    """On a rank that buckets its first chunk, the bucket reduced last and gathered first."""

    params: int
    """Its parameters (at least the embedding's, on the embedding's rank)."""
    group: str
    """The group it reduces over ("dp", or "edp" for a rank of routed experts alone)."""
    embedding: int
    """The embedding's parameters in it (gathered in the training dtype)."""
    edges: int
    """The rank's embedding and output-layer parameters."""


def _sharded_reduce(job: Job, named: list[tuple[int, str]], forward_ms: float,
                    backward_ms: float, step: float, unbucketed: FirstChunk | None,
                    first_bucket: FirstBucket) -> Reduction:
    """The distributed optimizer's reduce-scatter and all-gather of the buffers `named`
    ((parameters, group) each), the last bucket (`unbucketed`'s first chunk whole, else
    `first_bucket`) the floor of what each exposes."""
    grads, w16 = grad_bytes(job.arch), DTYPE_BYTES[job.arch.dtype]
    weights = gathered_weight_bytes(job.arch, w16)
    share = job.collective_sm_share

    def rs(n: float, g: str) -> float:
        return sharded_reduce_ms(n * grads, job.link(g + "_shard"), job.link(g + "_replica"))

    def ag_bytes(n: float, wide: float = 0.0) -> float:
        """`wide` of the `n` gathered in the training dtype."""
        return n * weights + wide * (w16 - weights)

    def ag(n: float, g: str, wide: float = 0.0) -> float:
        return all_gather_ms(ag_bytes(n, wide), job.link(g + "_shard"))

    fb = first_bucket
    last = [(fb.params, fb.group, min(fb.params, fb.embedding))] if unbucketed is None else [
        (unbucketed.dense, "dp", fb.edges if unbucketed.whole else fb.embedding),
        (unbucketed.experts, "edp", 0)]
    every = sum(ag(n, g, fb.edges if g == "dp" else 0) for n, g in named)
    first = sum(ag(n, g, wide) for n, g, wide in last if n)
    reduce = overlapped("gradient reduce-scatter", sum(rs(n, g) for n, g in named),
                        sum(rs(n, g) for n, g, _ in last if n), backward_ms,
                        job.overlap_grad_reduce, share, "backward",
                        sum(n * grads for n, _ in named))
    gathered_bytes = sum(ag_bytes(n, fb.edges if g == "dp" else 0) for n, g in named)
    if not (job.overlap_param_gather_with_optimizer_step and unbucketed is not None):
        gather = overlapped("parameter all-gather", every, first, forward_ms,
                            job.overlap_param_gather, share, "forward", gathered_bytes)
        return reduce + gather
    # The first chunk's gather starts once its own optimizer has stepped, beside the other
    # chunks' steps; the rest one chunk ahead of their forwards.
    params = sum(n for n, _ in named)
    others = 1 - (unbucketed.dense + unbucketed.experts) / params if params else 0.0
    gathered = StepCollective(what="parameter all-gather", total_ms=every, beside="forward",
                              nbytes=gathered_bytes,
                              unhidden_ms=unhidden_ms(first, step * others)
                              + unhidden_ms(every - first, forward_ms))
    return Reduction(cost_ms=reduce.cost_ms + behind_compute_ms(first, step * others, share)
                     + behind_compute_ms(every - first, forward_ms, share),
                     on_links=(*reduce.on_links, gathered))


def step_ms(job: Job, dense: int, experts: int, edges: int,
            memory_bandwidth_gbps: float) -> float:
    """The optimizer's step on the rank's weights (`edges` of the dense ones the
    embedding's and the output layer's), the share it owns under the distributed
    optimizer or FSDP: AdamW's memory traffic, or Muon's (ppsim.costs.muon), or the rate
    a cost file timed this model's step at (ADAM_BYTES_PER_PARAM a weight); with part of
    it on the host, that part's copies and step beside the device's (ppsim.job.host_optimizer)."""
    sharded = job.arch.fsdp or job.arch.distributed_optimizer

    def owned(n: float, group: str) -> float:
        return n / job.link(group + "_shard").size if sharded and n else n

    if job.arch.optimizer == "muon" and not job.timed_step:
        return muon_step_ms(job.arch, job.accelerator, owned(dense - edges, "dp"),
                            owned(experts, "edp"), owned(edges, "dp"), memory_bandwidth_gbps)
    shard = owned(dense, "dp") + owned(experts, "edp")
    host = job.host_optimizer
    on_host = shard * host.fraction if host is not None else 0.0
    device = (shard - on_host) * adam_step_bytes(job.arch) / (memory_bandwidth_gbps * 1e6) \
        if memory_bandwidth_gbps > 0 else 0.0
    return host.step_ms(device, on_host) if host is not None else device
