"""Throughput in the units training logs print: tokens/s (torchtitan), TFLOP/s per GPU
(Megatron's `throughput per GPU (TFLOP/s/GPU)`), and MFU against the hardware's peak."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ppsim.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Throughput:
    tokens_per_s: float
    """Tokens the whole job trains on per second."""
    tokens_per_s_per_gpu: float
    """tokens_per_s over the job's GPUs."""
    tflops_per_gpu: float
    """Megatron's FLOPs of an iteration (ppsim.job.flops) per second per GPU, in 10^12."""
    mfu: float
    """tflops_per_gpu over the hardware's dense peak."""
    torchtitan_tflops_per_gpu: float | None = None
    """The same time by torchtitan's count (ppsim.job.flops.torchtitan_flops_per_token,
    the whole s x s attention): what its log's `tflops` prints; None without a model."""
    torchtitan_mfu: float | None = None
    """That over the peak: its log's `mfu`."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput(tokens: int, flops: float, gpus: int, iteration_ms: float,
               peak_tflops: float, torchtitan_flops: float | None = None
               ) -> Throughput | None:
    """An iteration of `tokens` and `flops` (`torchtitan_flops` by torchtitan's count) on
    `gpus` taking iteration_ms; None when the time is not positive."""
    if iteration_ms <= 0 or gpus < 1:
        return None
    seconds = iteration_ms / 1e3

    def per_gpu(f: float) -> tuple[float, float]:
        tflops = f / seconds / gpus / 1e12
        return tflops, tflops / peak_tflops if peak_tflops > 0 else 0.0

    tflops, mfu = per_gpu(flops)
    titan = per_gpu(torchtitan_flops) if torchtitan_flops else (None, None)
    return Throughput(tokens_per_s=tokens / seconds, tokens_per_s_per_gpu=tokens / seconds / gpus,
                      tflops_per_gpu=tflops, mfu=mfu, torchtitan_tflops_per_gpu=titan[0],
                      torchtitan_mfu=titan[1])


def line(t: Throughput | None) -> str:
    """One line for text output."""
    if t is None:
        return "throughput: n/a (a uniform model has no tokens or FLOPs)"
    titan = "" if t.torchtitan_mfu is None else f" (torchtitan's count {t.torchtitan_mfu:.1%})"
    return (f"throughput {t.tokens_per_s:,.0f} tokens/s ({t.tokens_per_s_per_gpu:,.0f} per GPU), "
            f"{tflops_text(t.tflops_per_gpu)} TFLOP/s/GPU, MFU {t.mfu:.1%}{titan}")


def tflops_text(tflops: float) -> str:
    """TFLOP/s with one decimal, or three significant digits below 1 (a CPU's few GFLOP/s
    would print as 0.0)."""
    return f"{tflops:.1f}" if tflops >= 1 or tflops == 0 else f"{tflops:.3g}"


JOB_INFO_KEYS = ("tokens", "flops", "gpus", "peak_tflops")
"""What a trace's otherData.job records so a diff can print its throughput."""
OPTIONAL_INFO_KEYS = ("torchtitan_flops",)
"""What it records beside them that older traces lack."""


def job_info(job: Any) -> dict[str, float] | None:
    """The trace record of a job (ppsim.job.model.Job); None for no job."""
    if job is None:
        return None
    return {"tokens": job.shape.tokens, "flops": job.flops, "gpus": job.shape.gpus,
            "peak_tflops": job.peak_tflops, "torchtitan_flops": job.torchtitan_flops}


def over_processes(info: dict[str, float] | None, processes: int
                   ) -> dict[str, float] | None:
    """A run's recorded job over all its processes: the executor prices one replica where
    `--dp` starts more, so its tokens, FLOPs and GPUs grow by the replicas beside it."""
    if info is None or processes <= info["gpus"] or processes % int(info["gpus"]):
        return info
    k = processes // int(info["gpus"])
    return {key: v * k if key in ("tokens", "flops", "torchtitan_flops", "gpus") else v
            for key, v in info.items()}


def from_info(info: Any, where: str) -> dict[str, float] | None:
    """A trace's otherData.job checked: positive finite numbers; None when absent."""
    if info is None:
        return None
    if not isinstance(info, dict):
        raise UserError(where, "must be an object", "re-record the trace")
    out = {}
    for key in (*JOB_INFO_KEYS, *OPTIONAL_INFO_KEYS):
        v = info.get(key)
        if v is None and key in OPTIONAL_INFO_KEYS:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v <= 0 or v > 1e30:
            raise UserError(f"{where}.{key}", f"must be a positive number, got {v!r}"[:200],
                            "re-record the trace")
        out[key] = float(v)
    return out


def trace_throughput(info: dict[str, float] | None, iteration_ms: float) -> Throughput | None:
    """The throughput of an iteration of a recorded job."""
    if info is None:
        return None
    return throughput(int(info["tokens"]), info["flops"], int(info["gpus"]), iteration_ms,
                      info["peak_tflops"], info.get("torchtitan_flops"))
