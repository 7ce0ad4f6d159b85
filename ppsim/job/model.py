"""The Job: one training job's shape, links and overlaps, built once from a Config.

`build_job` gives None for a uniform model (it has no sizes, tokens or FLOPs). The
simulator reads a Job in two places: the layer costs (ppsim.job.layers adds the tensor-,
context- and expert-parallel collectives each layer waits for) and the step's tail
(ppsim.job.tail: the data-parallel gradient reduction and parameter gather, the part
the backward and the next forward do not hide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from ppsim.config import parallel_rules
from ppsim.costs.arch import Architecture
from ppsim.costs.grouptimes import TimedGroup
from ppsim.costs.layerops import (
    loss_chunks_problem,
    padded_vocab,
    sequence_split_problem,
    splittable_seq_length,
)
from ppsim.costs.state import grad_bytes
from ppsim.costs.transformer import Accelerator, accelerator
from ppsim.errors import UserError
from ppsim.job import deepep
from ppsim.job.collectives import Link, all_reduce_ms, link
from ppsim.job.flops import iteration_flops, torchtitan_flops_per_token
from ppsim.job.fsdp import FsdpSteps, fsdp_steps, megatron_buffer_bytes
from ppsim.job.host_optimizer import HostOptimizer, host_optimizer, host_rates_known
from ppsim.job.ranks import (
    Sizes,
    Span,
    pipeline_hops,
    split_spans,
    translates,
    worst_span,
)
from ppsim.job.shape import JobShape, job_shape, tp_overlap_refusal
from ppsim.job.tail import FirstChunk, Tail, first_chunk, rank_tail
from ppsim.job.throughput import Throughput, throughput
from ppsim.job.topology import Network, network

DATA_PARALLEL_GROUPS = ("dp", "edp", "dp_shard", "dp_replica", "edp_shard", "edp_replica")
"""The groups a step's gradients reduce and its parameters gather over."""


@dataclass(frozen=True, kw_only=True)
class Groups:
    """Where each kind of collective group sits: its worst placed group
    (ppsim.job.ranks.worst_span)."""

    tp: Span
    """The tensor-parallel group."""
    cp: Span
    """The context-parallel ring."""
    cp_a2a: Span
    """Under a2a+p2p, one all-to-all's consecutive ranks of the cp group."""
    cp_p2p: Span
    """Under a2a+p2p, the ring across the all-to-all groups (every cp_a2a_size-th rank)."""
    ep: Span
    """The expert-parallel group (etp x ep x edp world)."""
    etp: Span
    """The expert tensor-parallel group (the all-to-all dispatcher gathers over it)."""
    dp: Span
    """Gradients reduce over dp x cp (Megatron's dp_cp group)."""
    edp: Span
    """Routed experts' gradients reduce over the expert data-parallel group, tp x cp x dp
    / (etp x ep) ranks (Megatron's expt_dp group)."""
    dp_shard: Span
    """The ranks one copy of the sharded state spans: the first 1 / dp_replicas of the
    dp x cp group (Megatron's intra-instance group, torchtitan's dp_shard x cp)."""
    dp_replica: Span
    """The copies' ranks holding the same shard (Megatron's inter-instance group,
    torchtitan's dp_replicate)."""
    edp_shard: Span
    """dp_shard of the expert data-parallel group."""
    edp_replica: Span
    """dp_replica of the expert data-parallel group."""
    pipeline_hops: tuple[bool, ...]
    """Per pipeline boundary of the first replica: does it cross nodes?"""


@dataclass(frozen=True, kw_only=True)
class Job:
    """One training job: the model, its shape, its links and its overlaps."""

    arch: Architecture
    """The model as configured (whole sequences)."""
    shape: JobShape
    """Sizes and batch."""
    network: Network
    """The links (ppsim.job.topology)."""
    groups: Groups
    """Where each group sits on them."""
    peak_tflops: float
    """Dense peak per GPU, the MFU's denominator."""
    accelerator: Accelerator
    """The [hardware] table's compute figures (ppsim.costs.transformer)."""
    tp_comm_overlap: bool = False
    """Hide tensor-parallel collectives behind the layer's compute."""
    overlap_grad_reduce: bool = False
    """Reduce gradient buckets during the last backward."""
    moe_shared_expert_overlap: bool = False
    """Hide the expert-parallel all-to-alls behind the shared experts' compute."""
    overlap_param_gather: bool = False
    """Gather parameters during the next forward."""
    overlap_param_gather_with_optimizer_step: bool = False
    """Gather the first chunk's parameters behind the other chunks' optimizer steps."""
    overlap_moe_expert_parallel_comm: bool = False
    """Megatron's combined 1F1B: each steady-phase forward runs beside another
    microbatch's backward, their all-to-alls behind each other's compute."""
    moe_token_dispatcher_type: str = "alltoall"
    """How routed tokens travel: "alltoall" (NCCL), "flex" (DeepEP)."""
    delay_wgrad_compute: bool = False
    """In a combined pair the experts' weight gradients run beside the dispatch's
    backward (else before it: the dispatch waits for them)."""
    flex_dispatcher_num_sms: int | None = None
    """SMs DeepEP's kernels hold (--moe-flex-dispatcher-num-sms); None: Megatron's 20."""
    sm_count: int = 0
    """The GPU's streaming multiprocessors; 0: unknown."""
    collective_sms: int = 0
    """SMs an NCCL collective's kernel holds while it runs (its channels); 0: unknown."""
    ddp_bucket_size: int | None = None
    """Parameters per gradient bucket; None: Megatron's default."""
    ddp_num_buckets: int | None = None
    """Or buckets per rank."""
    timed: tuple[TimedGroup, ...] = ()
    """Groups' collectives as a cost file timed them: each prices the job's groups it
    names of the size it was timed on (ppsim.costs.grouptimes; "dp": every
    data-parallel one)."""
    timed_step: bool = False
    """A cost file timed this model's optimizer step (its fixed time and rate price the
    step, Muon's too) rather than the model's roofline."""
    host_optimizer: HostOptimizer | None = None
    """Part of the optimizer on the host (ppsim.job.host_optimizer); None: all on the
    device."""
    host_rates_known: bool = False
    """The hardware gives what the host optimizer is priced by (its link, DRAM, cores)."""

    @property
    def deepep(self) -> bool:
        """Routed tokens travel by DeepEP (the flex dispatcher, with experts)."""
        return self.moe_token_dispatcher_type == "flex" and self.arch.num_experts > 0

    @property
    def deepep_sms(self) -> int:
        """The SMs DeepEP's kernels hold (Megatron's 20 unless given)."""
        return self.flex_dispatcher_num_sms or deepep.DEFAULT_SMS

    @property
    def dispatcher_sm_share(self) -> float:
        """The share of the GPU's SMs the token dispatcher's kernels hold while compute
        runs beside them: DeepEP's over the GPU's; 0 for NCCL's all-to-all (NCCL picks
        its channels and no figure gives their SMs) or an unknown SM count."""
        if not self.deepep or not self.sm_count:
            return 0.0
        return self.deepep_sms / self.sm_count

    @property
    def collective_sm_share(self) -> float:
        """The share of the GPU's SMs a data-parallel collective's kernel holds from the
        compute it runs beside: NCCL's channels, one CTA each, never sharing an SM with
        compute; 0 where either count is unknown."""
        if not self.sm_count:
            return 0.0
        return min(self.collective_sms, self.sm_count) / self.sm_count

    @property
    def deepep_buffer_bytes(self) -> int:
        """What DeepEP's one buffer takes on each GPU (ppsim.job.deepep); 0 without it."""
        if not self.deepep:
            return 0
        return deepep.buffer_bytes(self.arch.expert_tp * self.arch.ep, self.arch.hidden_size,
                                   self.deepep_sms)

    @property
    def fsdp_buffer_bytes(self) -> int:
        """What Megatron-FSDP's buffers take on each GPU (ppsim.job.fsdp); 0 without it."""
        return megatron_buffer_bytes(self.arch)

    @property
    def fsdp_steps(self) -> FsdpSteps | None:
        """When FSDP's collectives run (ppsim.job.fsdp); None without FSDP."""
        if not self.arch.fsdp:
            return None
        return fsdp_steps(self.arch.fsdp_reshard_after_forward, self.shape.sizes.pp > 1,
                          self.arch.fsdp_framework)

    @property
    def in_microbatches(self) -> bool:
        """Some group communicates inside a microbatch's forward or backward: tp, cp or
        ep > 1, experts split over etp > 1, or FSDP syncing every microbatch."""
        steps = self.fsdp_steps
        experts_split = self.arch.num_experts > 0 and self.arch.expert_tp > 1
        return (self.arch.tp > 1 or self.arch.cp > 1 or self.arch.ep > 1 or experts_split
                or (steps is not None and steps.per_microbatch))

    def link(self, name: str) -> Link:
        """The Link of group `name` (a field of Groups: tp, cp, ep, dp, edp, ...)."""
        where = getattr(self.groups, name)
        found = link(self.network, where)
        if not self.timed:  # priced by the closed forms (every job the planner tries)
            return found
        family = "dp" if name in DATA_PARALLEL_GROUPS else name
        for t in self.timed:
            if t.group == family and t.times.size == where.size:
                return replace(found, timed=t.times)
        return found

    @property
    def replaces_tail(self) -> bool:
        """The step is the job's (dp x cp > 1, or tied embeddings over stages); else a
        replica's alone."""
        return self.groups.dp.size > 1 or self.ties_stages

    @property
    def ties_stages(self) -> bool:
        """The first and last stage hold one tied embedding: the job prices the step,
        with the all-reduce of its gradient where they are on two ranks
        (embedding_sync_ms)."""
        return self.arch.tie_embeddings and self.shape.sizes.pp > 1

    @property
    def embedding_params(self) -> int:
        """The word embedding's parameters on one tensor-parallel rank (its padded
        vocabulary's 1/tp share)."""
        return padded_vocab(self.arch) * self.arch.hidden_size // self.arch.tp

    def embedding_sync_ms(self, pipeline_rank: int, ends: tuple[int, int]) -> float:
        """The tied embedding's gradient all-reduce on this pipeline rank (fp32, its
        1/tp vocabulary shard, over the link between the first and last stage); `ends`:
        the embedding's and the head's pipeline ranks. None where one rank holds both
        (a V placement): one parameter there gathers both gradients itself."""
        if not self.ties_stages or ends[0] == ends[1] or pipeline_rank not in ends:
            return 0.0
        return all_reduce_ms(self.embedding_sync_bytes, link(self.network, self.tied_pair))

    @property
    def embedding_sync_bytes(self) -> float:
        """The tied embedding's gradient that embedding_sync_ms all-reduces: fp32 (the
        main grads' type), its 1/tp vocabulary shard."""
        return self.embedding_params * grad_bytes(self.arch)

    @property
    def tied_pair(self) -> Span:
        """The first and the last stage's ranks, which embedding_sync_ms joins: on two
        nodes where any pipeline boundary crosses one."""
        hops = self.groups.pipeline_hops
        return Span(size=2, per_node=1 if any(hops) else 2, nodes=2 if any(hops) else 1)

    def tail(self, params: int, forward_ms: float, backward_ms: float,
             memory_bandwidth_gbps: float, optimizer_fixed_ms: float = 0.0,
             holds_embedding: bool = False, expert_params: int = 0,
             holds_head: bool = False, unbucketed: FirstChunk | None = None) -> Tail:
        """One rank's data-parallel step (ppsim.job.tail)."""
        return rank_tail(self, params, forward_ms, backward_ms, memory_bandwidth_gbps,
                         optimizer_fixed_ms, holds_embedding, expert_params, holds_head,
                         unbucketed)

    def unbucketed(self, stage_ranks: Sequence[int], costs: Sequence[Any], rank: int
                   ) -> FirstChunk | None:
        """The chunk whose whole gradients wait at the end on `rank` (ppsim.job.tail)."""
        return first_chunk(stage_ranks, costs, rank,
                           every_rank=self.overlap_param_gather_with_optimizer_step)

    @property
    def flops(self) -> float:
        return iteration_flops(self.arch, self.shape.global_batch_size)

    @property
    def torchtitan_flops(self) -> float:
        return self.shape.tokens * torchtitan_flops_per_token(self.arch)

    def throughput(self, iteration_ms: float) -> Throughput | None:
        return throughput(self.shape.tokens, self.flops, self.shape.gpus, iteration_ms,
                          self.peak_tflops, self.torchtitan_flops)

    def describe(self) -> dict[str, Any]:
        """The job for JSON: sizes (with sequence parallelism at tp > 1), batch, sharding,
        FP8 (None in bf16), the optimizer, the combined 1F1B's all-to-all overlap, the SMs
        communication holds, and which groups cross nodes."""
        s, g = self.shape.sizes, self.groups
        return {"gpus": s.gpus, "tp": s.tp, "cp": s.cp, "ep": s.ep, "etp": s.expert_tp,
                "dp": s.dp, "pp": s.pp,
                "sequence_parallel": s.tp > 1 and self.arch.sequence_parallel,
                "global_batch_size": self.shape.global_batch_size,
                "micro_batch_size": self.shape.micro_batch_size,
                "seq_length": self.shape.seq_length, "rank_order": self.shape.rank_order,
                "data_parallel": data_parallel(self.arch),
                "fsdp_framework": fsdp_framework(self.arch),
                "dp_replicas": self.arch.dp_replicas,
                "fp8": {"format": self.arch.fp8, "recipe": self.arch.fp8_recipe,
                        "param_gather": self.arch.fp8_param_gather} if self.arch.fp8 else None,
                "cp_comm_type": self.arch.cp_comm_type,
                "optimizer": self.arch.optimizer,
                "ep_overlap": self.overlap_moe_expert_parallel_comm,
                "moe_token_dispatcher_type": self.moe_token_dispatcher_type,
                "dispatcher_sm_share": self.dispatcher_sm_share,
                "collective_sm_share": self.collective_sm_share,
                "deepep_buffer_bytes": self.deepep_buffer_bytes,
                "fsdp_buffer_bytes": self.fsdp_buffer_bytes,
                "crosses_nodes": {"tp": g.tp.crosses_nodes, "cp": g.cp.crosses_nodes,
                                  "ep": g.ep.crosses_nodes, "etp": g.etp.crosses_nodes,
                                  "dp": g.dp.crosses_nodes,
                                  "pipeline": list(g.pipeline_hops)}}


def fsdp_framework(a: Architecture) -> str | None:
    """Who shards the replicas fully (Architecture.fsdp_framework); None without FSDP."""
    return a.fsdp_framework if a.fsdp else None


def data_parallel(a: Architecture) -> str:
    """How the replicas keep their state: "fsdp", "distributed optimizer" or "ddp"."""
    if a.fsdp:
        return "fsdp"
    return "distributed optimizer" if a.distributed_optimizer else "ddp"


@lru_cache(maxsize=256)
def groups(sizes: Sizes, order: str, gpus_per_node: int, replicas: int = 1,
           cp_a2a: int = 1) -> Groups:
    """The spans of each kind's worst placed group (cached: the planner asks for the same
    shapes often); `replicas`: copies of the sharded state, each a contiguous 1 / replicas of the
    data-parallel group (Megatron's partial distributed optimizer groups); `cp_a2a`: the
    ranks of a2a+p2p's all-to-all, consecutive in the cp group (Megatron's
    create_hierarchical_groups), its ring across them."""
    def placed(dims: tuple[str, ...], experts: bool = False) -> list[list[int]]:
        return translates(sizes, dims, gpus_per_node, order, experts)

    def where(dims: tuple[str, ...], experts: bool = False) -> Span:
        return worst_span(placed(dims, experts), gpus_per_node)

    def split(dims: tuple[str, ...], experts: bool = False) -> tuple[Span, Span, Span]:
        """The whole group, one copy's block of it, and the ranks across the copies."""
        every = placed(dims, experts)
        inner = max(1, len(every[0]) // replicas)
        return (worst_span(every, gpus_per_node), *split_spans(every, inner, gpus_per_node))

    dp, dp_shard, dp_replica = split(("cp", "dp"))
    edp, edp_shard, edp_replica = split(("dp",), experts=True)
    cp_a2a_span, cp_p2p_span = split_spans(placed(("cp",)), cp_a2a, gpus_per_node)
    return Groups(tp=where(("tp",)), cp=where(("cp",)), cp_a2a=cp_a2a_span,
                  cp_p2p=cp_p2p_span, ep=where(("ep",), experts=True),
                  etp=where(("tp",), experts=True),
                  dp=dp, edp=edp, dp_shard=dp_shard, dp_replica=dp_replica,
                  edp_shard=edp_shard, edp_replica=edp_replica,
                  pipeline_hops=tuple(pipeline_hops(sizes, gpus_per_node, order)))


def _sequence_splits(a: Architecture) -> None:
    """Megatron's refusal of tokens its sequence parallelism cannot scatter, for the job
    as configured (a job search's shapes are filtered by the same rule)."""
    problem = None if a.torchtitan_fsdp else sequence_split_problem(
        a.seq_length, a.cp, a.tp, a.sequence_parallel)
    if problem is not None:
        raise UserError("model.seq_length", problem, "use --seq-length "
                        f"{splittable_seq_length(a.seq_length, a.cp, a.tp)}, a --tp that "
                        "divides the tokens, or --no-sequence-parallel")
    problem = loss_chunks_problem(a.seq_length, a.cp, a.loss_chunks)
    if problem is not None:
        raise UserError("model.seq_length", problem, "give a sequence length the chunks "
                        "divide, or another --cp")


def build_job(cfg: Any, timed: tuple[TimedGroup, ...] = ()) -> Job | None:
    """The Job of a Config; None for a uniform model. `timed`: the groups' collectives a
    cost file timed."""
    shape = job_shape(cfg)
    if shape is None:
        return None
    tp_overlap_refusal(cfg)
    _sequence_splits(cfg.model.arch)
    parallel_rules.built(cfg.model.arch)
    net = network(cfg.hardware)
    p = cfg.pipeline
    return Job(arch=cfg.model.arch, shape=shape, network=net,
               groups=groups(shape.sizes, shape.rank_order, net.gpus_per_node,
                             cfg.model.arch.dp_replicas, cfg.model.arch.cp_a2a_size or 1),
               peak_tflops=cfg.hardware.peak_tflops, accelerator=accelerator(cfg.hardware),
               tp_comm_overlap=p.tp_comm_overlap,
               overlap_grad_reduce=p.overlap_grad_reduce,
               moe_shared_expert_overlap=p.moe_shared_expert_overlap,
               overlap_param_gather=p.overlap_param_gather,
               overlap_param_gather_with_optimizer_step=p.overlap_param_gather_with_optimizer_step,
               overlap_moe_expert_parallel_comm=p.overlap_moe_expert_parallel_comm,
               moe_token_dispatcher_type=p.moe_token_dispatcher_type,
               delay_wgrad_compute=p.delay_wgrad_compute,
               flex_dispatcher_num_sms=p.moe_flex_dispatcher_num_sms,
               sm_count=getattr(cfg.hardware, "sm_count", 0),
               collective_sms=getattr(cfg.hardware, "collective_sms", 0),
               ddp_bucket_size=p.ddp_bucket_size, ddp_num_buckets=p.ddp_num_buckets,
               timed=timed, host_optimizer=host_optimizer(cfg.model.arch, cfg.hardware),
               host_rates_known=host_rates_known(cfg.hardware))
