"""Tensor-parallel collectives without --tp-comm-overlap: Megatron's async ones.

A column-parallel linear (Megatron's LinearWithGradAccumulationAndAsyncCommunication,
the output layer's too; Transformer Engine's LayerNormLinear and Linear without
userbuffers) launches the collectives of its backward on NCCL's stream and computes
beside each (CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron asks for at tp > 1, queues
each collective ahead of its GEMM). With sequence parallelism: the second all-gather of
its input (traffic.regathers) beside the input-gradient GEMM, then the reduce-scatter of
the input's gradient beside the weight-gradient GEMM; without it the all-reduce of the
input's gradient (`allreduce_dgrad`) beside the weight-gradient GEMM. Everything else
waits: the forward's gathers, scatters and all-reduces, the row-parallel linears'
gathers of the output's gradient, a recompute's repeats. What a GEMM hides costs it
NCCL's SM share, as a data-parallel collective's does
(ppsim.job.collectives.behind_compute_ms).
"""

from __future__ import annotations

from ppsim.costs.arch import Architecture
from ppsim.costs.kinds import GemmWindow
from ppsim.job.collectives import behind_compute_ms
from ppsim.job.model import Job
from ppsim.job.traffic import Collective, PieceCollectives
from ppsim.job.userbuffers import TpTraffic


def runs_async(job: Job, a: Architecture) -> bool:
    """Whether the job's column-parallel backward runs its collectives beside its GEMMs:
    Megatron's and TE's linears at tp > 1, not torchtitan's (DTensor's redistributions
    run on the compute stream), unless the tensor-parallel group is timed by `ppsim
    profile` (the executor's, whose gloo collectives block, as its runs do)."""
    return a.tp > 1 and not a.torchtitan_fsdp and job.link("tp").timed is None


def beside_gemms_ms(t: TpTraffic, windows: tuple[GemmWindow, ...], sm_share: float) -> float:
    """What a backward waits for of its tensor-parallel collectives `t` without
    --tp-comm-overlap, its column-parallel linears' GEMMs `windows` (kinds.
    gathered_gemm_windows, one a sublayer, or kinds.head_gemm_window; () where nothing
    runs async: all of `t`). Each sublayer's re-gather hides behind its input-gradient
    GEMMs, and its input gradient's scatter or all-reduce (those a recompute does not
    repeat) behind its weight-gradient GEMMs, as far as each lasts."""
    if not windows:
        return t.total_ms
    # the forward's scatters and a recompute's are pipelined
    dgrads = t.scatters_ms - t.pipelined_ms + t.dgrad_reduces_ms
    waits = t.total_ms - t.regathers_ms - dgrads
    regather, dgrad = t.regathers_ms / len(windows), dgrads / len(windows)
    for w in windows:
        waits += behind_compute_ms(regather, w.input_grad_ms, sm_share) \
            + behind_compute_ms(dgrad, w.weight_grad_ms, sm_share)
    return waits


def linear_collectives(job: Job, f: TpTraffic, b: TpTraffic,
                       window: GemmWindow | None) -> PieceCollectives:
    """The tensor-parallel collectives `f` and `b` of a piece around one column-parallel
    linear (the head, an MTP depth's projection): the forward's waited for whole, the
    backward's beside the linear's GEMMs `window` (None where nothing runs async:
    runs_async), the rest exposed."""
    waits = beside_gemms_ms(b, (window,) if window is not None else (), job.collective_sm_share)
    return PieceCollectives(
        forward=(Collective(group="tp", total_ms=f.total_ms, exposed_ms=f.total_ms),)
        if f.total_ms else (),
        backward=(Collective(group="tp", total_ms=b.total_ms, exposed_ms=waits),)
        if b.total_ms else ())
