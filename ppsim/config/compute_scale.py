"""A device's compute rates slowed or sped up by one factor, and the factor that makes a
simulated iteration take as long as a training log says it took.

`ppsim calibrate --log` uses it: a job's own log is a measurement of its own cluster, so
the preset's compute rates are scaled to it (the links are left as they are: the factor
says how much faster or slower the kernels ran than the preset prices them), and the plan
that follows prices every other split and shape at the measured rate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ppsim.config.schema import HardwareConfig

SCALE_RANGE = (1 / 8, 8.0)
"""The factors a fit tries. Outside them the log and the job disagree by more than any
kernel rate explains (another job, or a shape the flags do not say)."""


def fastest_scale(hw: HardwareConfig) -> float:
    """The smallest factor the device allows: below it a matmul or attention would pass
    the device's peak."""
    fractions = [p[1] for p in hw.matmul_efficiency or []] + [hw.efficiency,
                                                              hw.attention_efficiency]
    return max(fractions)


def scaled_compute(hw: HardwareConfig, factor: float) -> HardwareConfig:
    """`hw` with every kernel taking `factor` times as long: the matmul curve, the
    attention rate and the memory bandwidth divided by it, the least time a kernel
    takes multiplied by it. Links, memory and the host are unchanged."""
    if not factor >= fastest_scale(hw):
        raise ValueError(f"factor {factor} would run a kernel above the device's peak")
    curve = [[g, _figure(e / factor)] for g, e in hw.matmul_efficiency] \
        if hw.matmul_efficiency else hw.matmul_efficiency
    return replace(hw, efficiency=_figure(hw.efficiency / factor), matmul_efficiency=curve,
                   attention_efficiency=_figure(hw.attention_efficiency / factor),
                   memory_bandwidth_gbps=_figure(hw.memory_bandwidth_gbps / factor),
                   kernel_overhead_us=_figure(hw.kernel_overhead_us * factor))


def _figure(x: float) -> float:
    """Six significant digits: a table a person reads, a millionth off the exact scale."""
    return float(f"{x:.6g}")


@dataclass(frozen=True, kw_only=True)
class ScaleFit:
    """The factor found and the iteration it gives."""

    factor: float
    """Every kernel's time times this matches the target."""
    iteration_ms: float
    """The simulated iteration at `factor`."""
    steps: int
    """Simulations the search ran."""


@dataclass(frozen=True, kw_only=True)
class NoScale:
    """No factor in range reaches the target: the iterations at the range's two ends."""

    low: float
    high: float
    fastest_ms: float
    """The iteration at `low` (the fastest kernels tried)."""
    slowest_ms: float
    """The iteration at `high`."""


def fit_scale(iteration_ms: Callable[[float], float], target_ms: float, low: float,
              high: float, tolerance: float = 1e-4, max_steps: int = 40) -> ScaleFit | NoScale:
    """The factor in [low, high] at which `iteration_ms` (nondecreasing in the factor: a
    slower kernel never shortens an iteration) equals `target_ms` to `tolerance` of it.
    Regula falsi (the Illinois variant, which keeps the bracket closing): an iteration is
    nearly affine in the factor (compute scales, links do not), so a few simulations
    find it."""
    if not 0 < low <= high or target_ms <= 0:
        raise ValueError("need 0 < low <= high and a positive target")
    a, b = low, high
    fa, fb = iteration_ms(low) / target_ms - 1, iteration_ms(high) / target_ms - 1
    if fa > tolerance or fb < -tolerance:
        return NoScale(low=low, high=high, fastest_ms=(fa + 1) * target_ms,
                       slowest_ms=(fb + 1) * target_ms)
    steps, side = 2, 0
    best = (a, fa) if abs(fa) <= abs(fb) else (b, fb)
    while abs(best[1]) > tolerance and steps < max_steps:
        x = b - fb * (b - a) / (fb - fa) if fb != fa else (a + b) / 2
        fx = iteration_ms(x) / target_ms - 1
        steps += 1
        if abs(fx) < abs(best[1]):
            best = (x, fx)
        if fx < 0:
            a, fa = x, fx
            fb, side = (fb / 2, -1) if side == -1 else (fb, -1)
        else:
            b, fb = x, fx
            fa, side = (fa / 2, 1) if side == 1 else (fa, 1)
    return ScaleFit(factor=best[0], iteration_ms=(best[1] + 1) * target_ms,
                    steps=steps)
