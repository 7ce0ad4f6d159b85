"""Every [hardware] number finite and in range: the device, its links, its host."""

from __future__ import annotations

from typing import Any

from ppsim.config.memo import value_key
from ppsim.config.validate import (
    MAX_BYTES,
    MAX_MS,
    MAX_TFLOPS,
    MIN_TFLOPS,
    bandwidth,
    count,
    number,
    shown,
)
from ppsim.errors import UserError

_CHECKED: set[tuple[Any, ...]] = set()
"""The HardwareConfig values `hardware` passed (a job search checks one per shape)."""


def hardware(hw: Any) -> None:
    """Every [hardware] number finite and in range (a HardwareConfig); values that passed
    once pass again without the checks."""
    key = value_key(hw)
    if key is not None and key in _CHECKED:
        return
    _check(hw)
    if key is not None:
        if len(_CHECKED) >= 256:  # a bound: a session rarely sees more than a few
            _CHECKED.clear()
        _CHECKED.add(key)


def _check(hw: Any) -> None:
    number("hardware.memory_bytes", hw.memory_bytes, lo=0.0, lo_open=True, hi=MAX_BYTES,
           fix="give the memory one rank may use, e.g. 80e9 (--memory-gb 80)")
    number("hardware.p2p_latency_ms", hw.p2p_latency_ms, hi=MAX_MS,
           fix="give the latency in ms, 0 for none")
    bandwidth("hardware.p2p_bandwidth_gbps", hw.p2p_bandwidth_gbps, "for free transfers")
    number("hardware.peak_tflops", hw.peak_tflops, lo=MIN_TFLOPS, hi=MAX_TFLOPS,
           fix=f"give the accelerator's dense peak in TFLOP/s, {MIN_TFLOPS:g} to "
           f"{MAX_TFLOPS:g}, e.g. 989")
    for fmt, example in (("fp8", 1979), ("fp4", 9000)):
        _optional_peak(hw, fmt, example)
    number("hardware.efficiency", hw.efficiency, lo=0.0, lo_open=True, hi=1.0,
           fix="give the achieved fraction of peak, e.g. 0.5")
    for fmt in ("fp8", "fp4"):
        number(f"hardware.{fmt}_efficiency_ratio", getattr(hw, f"{fmt}_efficiency_ratio", 1.0),
               lo=0.0, lo_open=True, hi=2.0, fix=f"give {fmt.upper()}'s share of peak over "
               "bf16's at one size, e.g. 0.92 (1: the same)")
    number("hardware.attention_efficiency", getattr(hw, "attention_efficiency", 0.0), hi=1.0,
           fix="give FlashAttention's fraction of peak, or 0 to time it as a matmul")
    bandwidth("hardware.memory_bandwidth_gbps", getattr(hw, "memory_bandwidth_gbps", 0.0),
              "to leave memory-bound ops free")
    number("hardware.kernel_overhead_us", getattr(hw, "kernel_overhead_us", 0.0),
           hi=MAX_MS * 1e3, fix="give microseconds per kernel, or 0")
    for name, zero_means in (("intra_node_bandwidth_gbps", "for the inter-node figure"),
                             ("inter_node_bandwidth_gbps", "for p2p_bandwidth_gbps")):
        bandwidth(f"hardware.{name}", getattr(hw, name, 0.0), zero_means)
    for name in ("intra_node_latency_us", "inter_node_latency_us"):
        number(f"hardware.{name}", getattr(hw, name, 0.0), hi=MAX_MS * 1e3,
               fix="give the latency in microseconds, 0 for none")
    number("hardware.gpus_per_node", getattr(hw, "gpus_per_node", 1), lo=1, hi=1 << 16,
           fix="give the devices that share one host, e.g. 8")
    count("hardware.sm_count", getattr(hw, "sm_count", 0), lo=0, hi=1 << 16,
          fix="give the GPU's streaming multiprocessors (H100 SXM: 132), or 0 for unknown")
    sms = int(getattr(hw, "sm_count", 0))  # an integer: checked just above
    count("hardware.collective_sms", getattr(hw, "collective_sms", 0), lo=0,
          hi=max(0, sms - 1) if sms else 1 << 16,
          fix="give the SMs an NCCL collective holds (its channels, 16 on a node of 8 "
              "NICs), fewer than sm_count, or 0 for unknown")
    _host(hw)
    _matmul_curve(getattr(hw, "matmul_efficiency", None))


def _optional_peak(hw: Any, fmt: str, example: int) -> None:
    """[hardware] fp8_peak_tflops or fp4_peak_tflops: 0 (no such tensor cores) or a peak."""
    field, name = f"hardware.{fmt}_peak_tflops", fmt.upper()
    fix = (f"give the dense {name} peak in TFLOP/s, {MIN_TFLOPS:g} to {MAX_TFLOPS:g} (e.g. "
           f"{example}), or 0 for a device without {name}")
    peak = number(field, getattr(hw, f"{fmt}_peak_tflops", 0.0), hi=MAX_TFLOPS, fix=fix)
    if 0 < peak < MIN_TFLOPS:
        raise UserError(field, f"{peak:g} TFLOP/s is below the floor of {MIN_TFLOPS:g}", fix)


def _host(hw: Any) -> None:
    """The host's figures: its link, memory and bandwidth, a core's AdamW rate."""
    bandwidth("hardware.host_link_gbps", getattr(hw, "host_link_gbps", 0.0),
              "for free copies")
    number("hardware.host_memory_bytes", getattr(hw, "host_memory_bytes", 0.0), hi=MAX_BYTES,
           fix="give a node's host memory for offloaded activations, or 0 for no limit")
    bandwidth("hardware.host_memory_bandwidth_gbps",
              getattr(hw, "host_memory_bandwidth_gbps", 0.0), "for unknown")
    number("hardware.host_core_adam_gparams", getattr(hw, "host_core_adam_gparams", 0.0),
           hi=1e3, fix="give billions of parameters one host core steps a second with "
           "fused AdamW (benchmarks/bench_host_optimizer.py), or 0 for unknown")


def _matmul_curve(curve: Any) -> None:
    """[[GFLOP, fraction of peak], ...]: at most 1,000 points, each in range."""
    if curve is None:
        return
    fix = "write [[GFLOP, fraction of peak], ...], e.g. [[1, 0.2], [1000, 0.8]]"
    if not isinstance(curve, list) or len(curve) > 1000:
        raise UserError("hardware.matmul_efficiency", "must be a list of at most 1,000 "
                        "points", fix)
    for i, pt in enumerate(curve):
        where = f"hardware.matmul_efficiency[{i}]"
        if not isinstance(pt, list) or len(pt) != 2:
            raise UserError(where, f"expected [GFLOP, fraction], got {shown(pt)}", fix)
        number(where, pt[0], lo=0.0, lo_open=True, hi=1e12, fix=fix)
        number(where, pt[1], lo=0.0, lo_open=True, hi=1.0, fix=fix)
