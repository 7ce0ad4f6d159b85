"""Tensor-parallel collectives without --tp-comm-overlap: Megatron's async ones.

A sequence-parallel column-parallel linear (Megatron's LinearWithGradAccumulationAnd
AsyncCommunication, Transformer Engine's LayerNormLinear and Linear without userbuffers)
launches two collectives of its backward on NCCL's stream and computes beside each: the
second all-gather of its input (traffic.regathers) beside the input-gradient GEMM, then
the reduce-scatter of the input's gradient beside the weight-gradient GEMM
(CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron sets with sequence parallelism, queues each
collective ahead of its GEMM). Everything else waits: the forward's gathers and scatters,
the row-parallel linears' gathers of the output's gradient, a recompute's repeats. What a
GEMM hides costs it NCCL's SM share, as a data-parallel collective's does
(ppsim.job.collectives.behind_compute_ms).
"""

from __future__ import annotations

from ppsim.costs.arch import Architecture
from ppsim.costs.kinds import GemmWindow
from ppsim.job.collectives import behind_compute_ms
from ppsim.job.model import Job
from ppsim.job.traffic import regathers
from ppsim.job.userbuffers import TpTraffic


def runs_async(job: Job, a: Architecture) -> bool:
    """Whether the job's sequence-parallel backward runs the re-gather and the input
    gradient's scatter beside its GEMMs: Megatron's and TE's linears (traffic.regathers),
    unless the tensor-parallel group is timed by `ppsim profile` (the executor's, whose
    gloo collectives block, as its runs do)."""
    return regathers(a) and job.link("tp").timed is None


def beside_gemms_ms(t: TpTraffic, windows: tuple[GemmWindow, ...], sm_share: float) -> float:
    """What a layer's backward waits for of its tensor-parallel collectives `t` without
    --tp-comm-overlap, its gathered sublayers' GEMMs `windows` (kinds.
    gathered_gemm_windows, one a sublayer; () where nothing runs async: all of `t`).
    Each sublayer's re-gather hides behind its input-gradient GEMMs and its input
    gradient's scatter (the scatters a recompute does not repeat) behind its
    weight-gradient GEMMs, as far as each lasts."""
    if not windows:
        return t.total_ms
    scatters = t.scatters_ms - t.pipelined_ms  # the forward's and a recompute's are pipelined
    waits = t.total_ms - t.regathers_ms - scatters
    regather, scatter = t.regathers_ms / len(windows), scatters / len(windows)
    for w in windows:
        waits += behind_compute_ms(regather, w.input_grad_ms, sm_share) \
            + behind_compute_ms(scatter, w.weight_grad_ms, sm_share)
    return waits
