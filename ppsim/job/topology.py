"""The machine a job runs on: GPUs per node, the links inside a node and between nodes.

Figures are per GPU and per direction, in GB/s (10^9 bytes per second). A [hardware]
table sets them (its preset holds datasheet figures, ppsim.config.presets); a figure left
at 0 falls back to the table's point-to-point link, so a table that names no topology
prices every collective on that one link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Network:
    """Links a collective or a pipeline message may cross."""

    gpus_per_node: int
    """GPUs that share one node's NVLink domain."""
    intra_bandwidth_gbps: float
    """Inside a node (NVLink), per GPU per direction."""
    intra_latency_ms: float
    """One step of a collective inside a node."""
    inter_bandwidth_gbps: float
    """Between nodes: each GPU's own NIC, per direction."""
    inter_latency_ms: float
    """One step of a collective that crosses nodes."""


def network(hw: Any) -> Network:
    """The Network of a [hardware] table (ppsim.config.schema.HardwareConfig)."""
    inter_bw = hw.inter_node_bandwidth_gbps or hw.p2p_bandwidth_gbps
    inter_lat = hw.inter_node_latency_us / 1e3 if hw.inter_node_latency_us else hw.p2p_latency_ms
    intra_bw = hw.intra_node_bandwidth_gbps or inter_bw
    intra_lat = hw.intra_node_latency_us / 1e3 if hw.intra_node_latency_us else inter_lat
    return Network(gpus_per_node=max(1, hw.gpus_per_node), intra_bandwidth_gbps=intra_bw,
                   intra_latency_ms=intra_lat, inter_bandwidth_gbps=inter_bw,
                   inter_latency_ms=inter_lat)
