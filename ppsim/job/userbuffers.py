"""Tensor-parallel collectives under --tp-comm-overlap: Transformer Engine's userbuffers.

Megatron hands TE's `initialize_ub` the overlap configuration of --tp-comm-overlap-cfg,
or none, and TE's defaults then hold (transformer_engine/pytorch/module/base.py): a
layer's all-gathers before a GEMM run by ring exchange, each GEMM in tp chunks beside
the copy engines' peer copies, holding no SM; its reduce-scatters run as userbuffers
kernels on 16 SMs (`num_sm`), in the forward by the `pipeline` method (the GEMM split
in 4 chunks, each chunk's scatter beside the next chunk's GEMM, so the last chunk's
scatter has nothing left to hide it) and in the backward by the `bulk` method, beside
the weight-gradient GEMM. What the layer's compute hides of the scatters costs it their
SMs' share of its rate, as a data-parallel collective's does (ppsim.job.collectives.
behind_compute_ms).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.job.collectives import behind_compute_ms

SCATTER_SMS = 16
"""SMs TE's userbuffers kernels hold for a reduce-scatter (initialize_ub's num_sm)."""
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

    @property
    def total_ms(self) -> float:
        return self.gathers_ms + self.scatters_ms + self.reduces_ms


def overlapped_ms(t: TpTraffic, compute_ms: float, sm_count: int) -> float:
    """What the collectives `t` add to `compute_ms` of a layer's compute under
    --tp-comm-overlap: each pipelined scatter's last chunk, which follows the last GEMM
    chunk; of the rest, the part the compute does not hide, and the scatters' SMs' share
    of what it hides (0 for an unknown SM count)."""
    tail = t.pipelined_ms / PIPELINE_SPLITS
    rest, scatters = t.total_ms - tail, t.scatters_ms - tail
    if rest <= 0.0:
        return tail
    share = min(SCATTER_SMS, sm_count) / sm_count if sm_count else 0.0
    # What is hidden is gathers and scatters in their proportion on the links.
    return tail + behind_compute_ms(rest, compute_ms, share * scatters / rest)
