"""The throughput line keeps a CPU's small TFLOP/s readable instead of printing 0.0."""

from __future__ import annotations

from ppsim.job.throughput import Throughput, line, tflops_text


def test_small_rates_keep_three_significant_digits() -> None:
    assert tflops_text(412.345) == "412.3"
    assert tflops_text(0.004512) == "0.00451"
    assert tflops_text(0.0) == "0.0"
    t = Throughput(tokens_per_s=8929.0, tokens_per_s_per_gpu=4464.5, tflops_per_gpu=0.0045,
                   mfu=0.636)
    assert "0.0045 TFLOP/s/GPU" in line(t) and "0.0 TFLOP" not in line(t)
