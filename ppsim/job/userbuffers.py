"""Tensor-parallel collectives under --tp-comm-overlap: Transformer Engine's userbuffers.

Megatron hands TE's `initialize_ub` the overlap configuration of --tp-comm-overlap-cfg,
or none, and TE's defaults then hold (transformer_engine/pytorch/module/base.py): a
layer's all-gathers before a GEMM run by ring exchange, each GEMM in tp chunks beside
the copy engines' peer copies, holding no SM; its reduce-scatters run as userbuffers
kernels on 16 SMs (`num_sm`), in the forward by the `pipeline` method (the GEMM split
in 4 chunks, each chunk's scatter beside the next chunk's GEMM, so the last chunk's
scatter has nothing left to hide it) and in the backward by the `bulk` method, beside
the weight-gradient GEMM. The backward's second all-gather of a gathered block's input
(traffic.regathers) runs by the `bulk` method too, beside the input-gradient GEMM, on
16 SMs as well. What the layer's compute hides of the scatters and of those gathers
costs it their SMs' share of its rate, as a data-parallel collective's does
(ppsim.job.collectives.behind_compute_ms).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.job.collectives import behind_compute_ms

SCATTER_SMS = 16
"""SMs TE's userbuffers kernels hold for a reduce-scatter or a `bulk` all-gather
(initialize_ub's num_sm)."""
PIPELINE_SPLITS = 4
"""Chunks the forward's `pipeline` method splits a GEMM and its scatter into
(initialize_ub's num_splits)."""


@dataclass(frozen=True, kw_only=True)
class TpTraffic:
    """One direction of a layer's tensor-parallel collectives, ms on the tp links."""

    gathers_ms: float
    scatters_ms: float
    pipelined_ms: float = 0.0
    """Of the scatters, those the forward's `pipeline` method runs (the forward's own,
    and a full recompute's repeat of it in the backward)."""
    reduces_ms: float = 0.0
    """All-reduces, without sequence parallelism (which --tp-comm-overlap needs)."""
    dgrad_reduces_ms: float = 0.0
    """Of the all-reduces, the backward's of the column-parallel linears' input
    gradients (not a recompute's repeats of the forward's): Megatron runs them async
    beside the weight-gradient GEMMs (ppsim.job.tp_async)."""
    regathers_ms: float = 0.0
    """Of the gathers, the backward's second gathers of the column-parallel linears'
    inputs for their weight gradients (traffic.regathers): TE's `bulk` method runs them
    on userbuffers kernels' SMs, as it does the backward's scatters."""

    @property
    def total_ms(self) -> float:
        return self.gathers_ms + self.scatters_ms + self.reduces_ms


def overlapped_ms(t: TpTraffic, compute_ms: float, sm_count: int) -> float:
    """What the collectives `t` add to `compute_ms` of a layer's compute under
    --tp-comm-overlap: each pipelined scatter's last chunk, which follows the last GEMM
    chunk; of the rest, the part the compute does not hide, and the SMs' share of what it
    hides of the collectives on userbuffers kernels, the scatters and the re-gathers (0
    for an unknown SM count)."""
    tail = t.pipelined_ms / PIPELINE_SPLITS
    rest, on_sms = t.total_ms - tail, t.scatters_ms - tail + t.regathers_ms
    if rest <= 0.0:
        return tail
    share = min(SCATTER_SMS, sm_count) / sm_count if sm_count else 0.0
    # What is hidden is ring-exchange gathers and kernels' collectives in their
    # proportion on the links.
    return tail + behind_compute_ms(rest, compute_ms, share * on_sms / rest)
