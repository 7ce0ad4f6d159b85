"""Throughput in the units training logs print: tokens/s (torchtitan), TFLOP/s per GPU
(Megatron's `throughput per GPU (TFLOP/s/GPU)`), and MFU against the hardware's peak."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Throughput:
    tokens_per_s: float
    """Tokens the whole job trains on per second."""
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    """Megatron's FLOPs of an iteration (ppsim.job.flops) per second per GPU, in 10^12."""
    mfu: float
    """tflops_per_gpu over the hardware's dense peak."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput(tokens: int, flops: float, gpus: int, iteration_ms: float,
               peak_tflops: float) -> Throughput | None:
    """An iteration of `tokens` and `flops` on `gpus` taking iteration_ms; None when the
    time is not positive."""
    if iteration_ms <= 0 or gpus < 1:
        return None
    seconds = iteration_ms / 1e3
    tflops = flops / seconds / gpus / 1e12
    return Throughput(tokens_per_s=tokens / seconds, tokens_per_s_per_gpu=tokens / seconds / gpus,
                      tflops_per_gpu=tflops, mfu=tflops / peak_tflops if peak_tflops > 0 else 0.0)


def line(t: Throughput | None) -> str:
    """One line for text output."""
    if t is None:
        return "throughput: n/a (a uniform model has no tokens or FLOPs)"
    return (f"throughput {t.tokens_per_s:,.0f} tokens/s ({t.tokens_per_s_per_gpu:,.0f} per GPU), "
            f"{t.tflops_per_gpu:.1f} TFLOP/s/GPU, MFU {t.mfu:.1%}")
