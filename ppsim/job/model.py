"""The Job: one training job's shape, links and overlaps, built once from a Config.

`build_job` gives None for a uniform model (it has no sizes, tokens or FLOPs). The
simulator reads a Job in two places: the layer costs (ppsim.job.layers adds the tensor-,
context- and expert-parallel collectives each layer waits for) and the step's tail
(ppsim.job.tail: the data-parallel gradient reduction and parameter gather, the part
the backward and the next forward do not hide).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ppsim.costs.arch import Architecture
from ppsim.costs.transformer import Accelerator, accelerator
from ppsim.job.collectives import Link, link
from ppsim.job.flops import iteration_flops
from ppsim.job.ranks import Sizes, Span, group_ranks, pipeline_hops, span
from ppsim.job.shape import JobShape, job_shape
from ppsim.job.tail import Tail, rank_tail
from ppsim.job.throughput import Throughput, throughput
from ppsim.job.topology import Network, network


@dataclass(frozen=True, kw_only=True)
class Groups:
    """Where each collective group of rank 0 sits."""

    tp: Span
    cp: Span
    ep: Span
    """The expert-parallel group (tp x ep x edp world)."""
    dp: Span
    """Gradients reduce over dp x cp (Megatron's dp_cp group)."""
    pipeline_hops: tuple[bool, ...]
    """Per pipeline boundary of the first replica: does it cross nodes?"""


@dataclass(frozen=True, kw_only=True)
class Job:
    arch: Architecture
    """The model as configured (whole sequences)."""
    shape: JobShape
    network: Network
    groups: Groups
    peak_tflops: float
    accelerator: Accelerator
    """The [hardware] table's compute figures (ppsim.costs.transformer)."""
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

    def link(self, name: str) -> Link:
        """The Link of group `name` (tp, cp, ep or dp)."""
        return link(self.network, getattr(self.groups, name))

    @property
    def replaces_tail(self) -> bool:
        """The data-parallel step is the job's (dp x cp > 1); else a replica's alone."""
        return self.groups.dp.size > 1

    def tail(self, params: int, forward_ms: float, backward_ms: float,
             memory_bandwidth_gbps: float, optimizer_fixed_ms: float = 0.0) -> Tail:
        """One rank's data-parallel step (ppsim.job.tail)."""
        return rank_tail(self, params, forward_ms, backward_ms, memory_bandwidth_gbps,
                         optimizer_fixed_ms)

    @property
    def flops(self) -> float:
        return iteration_flops(self.arch, self.shape.global_batch_size)

    def throughput(self, iteration_ms: float) -> Throughput | None:
        return throughput(self.shape.tokens, self.flops, self.shape.gpus, iteration_ms,
                          self.peak_tflops)

    def describe(self) -> dict[str, Any]:
        """The job for JSON: sizes, batch, and which groups cross nodes."""
        s, g = self.shape.sizes, self.groups
        return {"gpus": s.gpus, "tp": s.tp, "cp": s.cp, "ep": s.ep, "dp": s.dp, "pp": s.pp,
                "global_batch_size": self.shape.global_batch_size,
                "micro_batch_size": self.shape.micro_batch_size,
                "seq_length": self.shape.seq_length, "rank_order": self.shape.rank_order,
                "crosses_nodes": {"tp": g.tp.crosses_nodes, "cp": g.cp.crosses_nodes,
                                  "ep": g.ep.crosses_nodes, "dp": g.dp.crosses_nodes,
                                  "pipeline": list(g.pipeline_hops)}}


@lru_cache(maxsize=256)
def groups(sizes: Sizes, order: str, gpus_per_node: int) -> Groups:
    """The spans of rank 0's groups (cached: the planner asks for the same shapes often)."""
    def where(dims: tuple[str, ...], experts: bool = False) -> Span:
        return span(group_ranks(sizes, dims, order, experts), gpus_per_node)

    return Groups(tp=where(("tp",)), cp=where(("cp",)), ep=where(("ep",), experts=True),
                  dp=where(("cp", "dp")),
                  pipeline_hops=tuple(pipeline_hops(sizes, gpus_per_node, order)))


def build_job(cfg: Any) -> Job | None:
    """The Job of a Config; None for a uniform model."""
    shape = job_shape(cfg)
    if shape is None:
        return None
    net = network(cfg.hardware)
    p = cfg.pipeline
    return Job(arch=cfg.model.arch, shape=shape, network=net,
               groups=groups(shape.sizes, shape.rank_order, net.gpus_per_node),
               peak_tflops=cfg.hardware.peak_tflops, accelerator=accelerator(cfg.hardware),
               tp_comm_overlap=p.tp_comm_overlap,
               overlap_grad_reduce=p.overlap_grad_reduce,
               overlap_param_gather=p.overlap_param_gather)
