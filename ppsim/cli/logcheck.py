"""`ppsim simulate --compare-log LOG`: the simulated iteration beside what the job's own
training log printed (ppsim.trace.joblog), in the units that log uses: Megatron-LM's
iteration time and TFLOP/s per GPU, torchtitan's tokens/s per device, TFLOP/s and MFU
by its own FLOP count."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ppsim.job.throughput import Throughput
from ppsim.trace.joblog import LoggedRun

_UNITS = {"iteration_ms": ("iteration", "ms", ",.1f"),
          "tflops_per_gpu": ("", "TFLOP/s/GPU", ",.1f"),
          "tokens_per_s_per_gpu": ("", "tokens/s/GPU", ",.0f"),
          "mfu": ("MFU", "", ".1%")}


@dataclass(frozen=True, kw_only=True)
class LogComparison:
    """The fields both the log and the simulation give, side by side."""

    framework: str
    """Whose log: "Megatron-LM" or "torchtitan"."""
    lines: int
    """Logged lines compared (their median)."""
    left_out: int
    """Lines left out as warm-up."""
    logged: dict[str, float]
    simulated: dict[str, float]
    error: dict[str, float]
    """simulated / logged - 1, per field."""
    global_batch_sizes: tuple[int, int] | None = None
    """(logged, simulated) where they differ: the two are not the same job."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _simulated(framework: str, iteration_ms: float, t: Throughput | None) -> dict[str, float]:
    """The simulation in the log's own units (torchtitan counts FLOPs its own way)."""
    out = {"iteration_ms": iteration_ms}
    if t is None:
        return out
    out["tokens_per_s_per_gpu"] = t.tokens_per_s_per_gpu
    if framework == "torchtitan":
        if t.torchtitan_tflops_per_gpu is not None and t.torchtitan_mfu is not None:
            out |= {"tflops_per_gpu": t.torchtitan_tflops_per_gpu, "mfu": t.torchtitan_mfu}
    else:
        out |= {"tflops_per_gpu": t.tflops_per_gpu, "mfu": t.mfu}
    return out


def compare(run: LoggedRun, iteration_ms: float, t: Throughput | None,
            global_batch_size: int | None = None) -> LogComparison:
    """The fields the log prints and the simulation gives, with the simulation's error;
    the two global batch sizes where the log prints one and it differs."""
    simulated = _simulated(run.framework, iteration_ms, t)
    logged = {k: v for k in simulated if (v := run.median(k)) is not None and v > 0}
    gbs = run.median("global_batch_size")
    return LogComparison(framework=run.framework, lines=len(run.steps), left_out=run.left_out,
                         logged=logged, simulated={k: simulated[k] for k in logged},
                         error={k: simulated[k] / v - 1 for k, v in logged.items()},
                         global_batch_sizes=(int(gbs), global_batch_size)
                         if gbs and global_batch_size and gbs != global_batch_size else None)


def _value(name: str, v: float) -> str:
    label, unit, fmt = _UNITS[name]
    return " ".join(x for x in (label, format(v, fmt), unit) if x)


def comparison_line(c: LogComparison) -> str:
    """One line of text: what the log printed, then the simulation with its error."""
    first = ", the first left out as warm-up" if c.left_out else ""
    if not c.logged:
        return (f"logged by {c.framework} ({c.lines} line(s){first}): nothing this "
                "simulation gives (a uniform model has no tokens or FLOPs)")
    logged = ", ".join(_value(k, v) for k, v in c.logged.items())
    simulated = ", ".join(f"{_value(k, c.simulated[k])} ({c.error[k]:+.1%})" for k in c.logged)
    other = "" if c.global_batch_sizes is None else (
        f" (but the log's global batch size is {c.global_batch_sizes[0]:,}, the simulated "
        f"job's {c.global_batch_sizes[1]:,}: not the same job)")
    return (f"logged by {c.framework} (median of {c.lines} line(s){first}): {logged}; "
            f"simulated: {simulated}{other}")
