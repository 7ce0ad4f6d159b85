"""The B200 and GB200 presets against their sources: datasheets and published measurements.

XLA's measured sm_100 bf16 table (xla/service/gpu/model/matmul_interpolator_data.h, in
bursts), FLOP/s at (batch, m, n, k); stas00/ml-engineering's MAMF table (the best of a
brute-force shape search): B200 SXM bf16 1745.0 TFLOP/s (77.6 % of 2250), FP8 3432.5
(76.3 % of 4500); NVIDIA's HGX/DGX B200 datasheets: 2250 / 4500 TFLOP/s dense, 180 GB,
8 TB/s, NVLink 5 1.8 TB/s per GPU, one 400 Gb/s NIC per GPU; GB200 NVL72: 360 PFLOPS FP8
for 72 GPUs, 13.4 TB of HBM3e, one NVLink domain of 72, NVLink-C2C 900 GB/s bidirectional
from a Grace to its two GPUs and 480 GB of LPDDR5X; MAMF GB200 bf16 72.9 %, FP8 72.3 %;
FlashAttention-4 reaches 1605 TFLOP/s on B200, up to 1.3x cuDNN 9.13.
"""

from __future__ import annotations

import pytest

from ppsim.config.presets import HARDWARE_PRESETS
from ppsim.costs.ops import Roofline, matmul_efficiency

XLA_SM100 = {(1, 2048, 1024, 1024): 466_742_805_477_070,
             (1, 4096, 2048, 2048): 1_141_633_331_162_574,
             (1, 2048, 2048, 4096): 1_185_758_993_960_727,
             (2, 2048, 2048, 4096): 1_324_942_674_121_775,
             (2, 4096, 4096, 2048): 1_337_930_917_225_602,
             (4, 4096, 4096, 2048): 1_543_980_334_681_405}
MAMF_BF16, MAMF_FP8 = 1745.0, 3432.5
B200 = HARDWARE_PRESETS["b200-180gb"]


def _tflops(gflop: float) -> float:
    r = Roofline(peak_tflops=B200["peak_tflops"],
                 matmul_efficiency=tuple(tuple(p) for p in B200["matmul_efficiency"]))
    return r.peak_tflops * matmul_efficiency(r, gflop)


@pytest.mark.parametrize(("shape", "measured"), sorted(XLA_SM100.items()))
def test_b200_matmuls_follow_xlas_measured_sm100_table(shape: tuple, measured: int) -> None:
    b, m, n, k = shape
    priced = _tflops(2.0 * b * m * n * k / 1e9)
    assert abs(priced - measured / 1e12) / (measured / 1e12) < 0.10


def test_b200_never_beats_the_best_shape_measured() -> None:
    assert all(_tflops(g) < MAMF_BF16 for g in (1.0, 64.0, 1024.0, 65536.0))


def test_b200_datasheet_figures() -> None:
    assert (B200["peak_tflops"], B200["fp8_peak_tflops"]) == (2250.0, 4500.0)
    assert B200["fp4_peak_tflops"] == 144e3 / 8 / 2  # FP4 with sparsity for 8, dense
    assert B200["memory_bytes"] == 180e9 and B200["sm_count"] == 148
    assert B200["intra_node_bandwidth_gbps"] == 1800.0 / 2  # each way
    assert B200["inter_node_bandwidth_gbps"] == 400 / 8  # one 400 Gb/s NIC a GPU
    assert B200["memory_bandwidth_gbps"] == pytest.approx(0.9 * 8000.0)
    # FP8 keeps bf16's share of its peak: MAMF's shares, 76.3 % against 77.6 %.
    ratio = (MAMF_FP8 / 4500.0) / (MAMF_BF16 / 2250.0)
    assert abs(B200["fp8_efficiency_ratio"] - ratio) < 0.01


def test_gb200_datasheet_figures() -> None:
    g = HARDWARE_PRESETS["gb200-186gb"]
    assert (g["peak_tflops"], g["fp8_peak_tflops"]) == (2500.0, 360e3 / 72)  # dense
    assert g["fp4_peak_tflops"] == 1440e3 / 72 / 2  # FP4 with sparsity for 72, dense
    assert abs(g["memory_bytes"] - 13.4e12 / 72) / g["memory_bytes"] < 0.001
    assert (g["gpus_per_node"], g["sm_count"]) == (72, 152)
    assert g["intra_node_bandwidth_gbps"] == 1800.0 / 2 and g["inter_node_bandwidth_gbps"] == 50
    assert g["host_link_gbps"] == 900.0 / 2 / 2  # shared by two GPUs, each way
    assert g["host_memory_bytes"] / g["gpus_per_node"] == 480e9 / 2
    assert abs(g["fp8_efficiency_ratio"] - 72.3 / 72.9) < 0.01
    assert abs(g["attention_efficiency"] - 1605 / 1.3 / 2500) < 0.01
    # XLA's measured sm_100 rates, at its own peak
    r = Roofline(peak_tflops=2500.0,
                 matmul_efficiency=tuple(tuple(p) for p in g["matmul_efficiency"]))
    for (b, m, n, k), measured in XLA_SM100.items():
        priced = 2500.0 * matmul_efficiency(r, 2.0 * b * m * n * k / 1e9)
        assert abs(priced - measured / 1e12) / (measured / 1e12) < 0.10
