"""The H100 preset's matmul curve against published measurements (issue 24).

A GPU in a training job is power-saturated: stas00/ml-engineering's mamf-finder measured
H200 bf16 (the H100's die, peak and 700 W TDP) sustained at 700-745 TFLOP/s (MSMF), 727
for a whole node computing at once, against 825-848 in a burst (MAMF)
(compute/accelerator/benchmarks/README.md). XLA's measured sm_90 bf16 table
(xla/service/gpu/model/matmul_interpolator_data.h) gives the shape of the curve in the
burst regime: 631,984,593,290,170 FLOP/s at 2048^3 and 783,328,793,548,203 at 4096^3.
"""

from __future__ import annotations

from ppsim.config.presets import HARDWARE_PRESETS
from ppsim.costs.ops import Roofline, matmul_efficiency

SUSTAINED_NODE_TFLOPS = 727.0  # ml-engineering, 8 H200s computing at once
SUSTAINED_MAX_TFLOPS = 745.0  # the highest single-GPU MSMF it reports
XLA_SM90 = {2048: 631.984593290170, 4096: 783.328793548203}  # TFLOP/s, M = N = K


def _roofline(name: str) -> Roofline:
    hw = HARDWARE_PRESETS[name]
    return Roofline(peak_tflops=hw["peak_tflops"],
                    matmul_efficiency=tuple(tuple(p) for p in hw["matmul_efficiency"]))


def _tflops(r: Roofline, n: int) -> float:
    return r.peak_tflops * matmul_efficiency(r, 2.0 * n ** 3 / 1e9)


def test_h100_large_matmuls_run_at_the_sustained_rate_not_a_burst() -> None:
    r = _roofline("h100-80gb")
    big = _tflops(r, 16384)  # 8.8 TFLOP: past the curve's last point
    assert big <= SUSTAINED_MAX_TFLOPS
    assert abs(big - SUSTAINED_NODE_TFLOPS) / SUSTAINED_NODE_TFLOPS < 0.02


def test_h100_curve_falls_off_for_smaller_matmuls_as_xla_measured() -> None:
    r = _roofline("h100-80gb")
    measured = XLA_SM90[2048] / XLA_SM90[4096]
    modelled = _tflops(r, 2048) / _tflops(r, 4096)
    assert abs(modelled - measured) < 0.05
