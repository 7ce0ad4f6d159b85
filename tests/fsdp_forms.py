"""Closed forms the FSDP tests share: a Llama-3-8B layer's parameters, the h100-80gb
preset's links as its datasheet figures give them, a ring collective's time, and a
four-layer Llama 3 8B job on one stage."""

from __future__ import annotations

from typing import Any

from ppsim.config.schema import config_from_dict

NV, NV_STEP, NIC, NIC_STEP = 450e6, 1e-3, 50e6, 5e-3  # bytes per ms, ms
"""NVLink 450 GB/s each way, 1 us a step; a 400 Gb/s NIC per GPU, 5 us a step."""
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
"""A Llama-3-8B layer: q and o, k and v (8 heads of 128), the SwiGLU MLP, two norms."""
EMBEDDING = 128256 * 4096
NCCL_SHARE = 16 / 132
"""An NCCL collective's 16 channels, an SM each, of the H100's 132 SMs."""


def cfg(model: dict[str, Any], pipe: dict[str, Any] | None = None) -> Any:
    """Llama 3 8B cut to four layers, no recompute, on one stage of four microbatches."""
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4,
                                       "recompute": "none", **model},
                             "pipeline": {"pp": 1, "microbatches": 4, **(pipe or {})},
                             "hardware": {"preset": "h100-80gb"}})


def tiny_cfg(preset: str, model: dict[str, Any], pp: int = 1) -> Any:
    """A tiny preset's job on four microbatches, four GPUs a node (random jobs' groups
    then cross nodes at small sizes)."""
    return config_from_dict({"model": {"preset": preset, **model},
                             "pipeline": {"pp": pp, "microbatches": 4},
                             "hardware": {"preset": "h100-80gb", "gpus_per_node": 4}})


def ring(n: int, nbytes: float, bw: float, step: float) -> float:
    """All-gather or reduce-scatter of an `nbytes` buffer over n ranks (nccl-tests)."""
    return (n - 1) * step + (n - 1) / n * nbytes / bw
