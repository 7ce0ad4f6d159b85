"""A Megatron MoE block's shared experts' tensor-parallel collectives under
--moe-shared-expert-overlap.

SharedExpertMLP then strips its linears of their tensor-parallel communication
(parallel_mode None, every userbuffers flag off) and runs its own on a side stream
beside the dispatcher (megatron/core/transformer/moe/shared_experts.py):
pre_forward_comm gathers the block's input in the training dtype
(gather_from_sequence_parallel_region, whose backward reduce-scatters the input's
gradient) and post_forward_comm reduce-scatters the output (its backward gathers the
output's gradient); a MoE at tp > 1 runs sequence parallel (MoELayer refuses it
otherwise: ppsim.config.parallel_rules). Each direction moves the same; fc1 keeps the
gathered input it computed with, so nothing is gathered again, and nothing runs beside
a GEMM (ppsim.job.tp_async) or on userbuffers.

The side stream runs these collectives and the shared experts' compute, the compute
stream everything else, the dispatcher's all-to-alls among it: the layer waits for the
side stream past what the all-to-alls take beyond the shared experts' compute
(ppsim.job.layers prices those all-to-alls as hidden behind that compute). Without
--moe-shared-expert-overlap the shared experts are one more sequence-parallel sublayer
of the layer (traffic.tp_sublayers).
"""

from __future__ import annotations

from ppsim.costs.arch import Architecture
from ppsim.job.collectives import all_gather_ms, reduce_scatter_ms
from ppsim.job.model import Job
from ppsim.job.traffic import hidden_bytes, shared_gathers


def beside_dispatcher(job: Job, a: Architecture, kind: str) -> bool:
    """Whether a layer of `kind`'s shared experts run their collectives on the side
    stream (--moe-shared-expert-overlap, at tp > 1)."""
    return job.moe_shared_expert_overlap and shared_gathers(a, kind)


def side_ms(job: Job, a: Architecture, kind: str) -> float:
    """The shared experts' side-stream collectives in one direction of a layer of `kind`
    (either: the backward mirrors the forward), ms on the tp links; 0 where they are a
    sublayer of the layer's own (traffic.tp_sublayers) or there are none."""
    if not beside_dispatcher(job, a, kind):
        return 0.0
    nbytes, link = hidden_bytes(a), job.link("tp")
    return all_gather_ms(nbytes, link) + reduce_scatter_ms(nbytes, link)


def side_waits_ms(side: float, all_to_alls: float, compute: float) -> float:
    """What the layer waits for of `side` ms of side-stream collectives beside the
    dispatcher's `all_to_alls` ms and the shared experts' `compute` ms: the side stream's
    time past the all-to-alls' (the all-to-alls' own wait beyond the compute is theirs)."""
    return max(0.0, side - max(0.0, all_to_alls - compute))
