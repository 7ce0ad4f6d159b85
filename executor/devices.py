"""What a device is, as far as [hardware] needs: the datasheet peaks of the GPUs ppsim
knows by name, and what a GPU reports of itself (its memory and SMs)."""

from __future__ import annotations

import torch

# Dense bf16 peaks (TFLOP/s) of GPUs we know; others use the best measured rate / 0.8.
# A name is matched in this order, so "GB200" comes before the "B200" it contains.
KNOWN_PEAKS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0,
               "GB200": 2500.0, "B200": 2250.0}
# Their dense FP8 peaks (datasheets; A100 has no FP8 tensor cores): what --fp8-format's
# matmuls run at, written beside the measured figures; 0 for a device not listed.
KNOWN_FP8_PEAKS = {"H200": 1979.0, "H100": 1979.0, "GH200": 1979.0, "L40S": 733.0,
                   "GB200": 5000.0, "B200": 4500.0}
# Dense FP4 peaks of the Blackwell GPUs (the HGX B200 and GB200 NVL72 datasheets, half
# their figures with sparsity), whose tensor cores also run MXFP8: --fp4-format's rate.
KNOWN_FP4_PEAKS = {"GB200": 10000.0, "B200": 9000.0}


def _known(device: torch.device, peaks: dict[str, float]) -> float | None:
    """The peak `peaks` gives this GPU by name; None for a CPU or a GPU not listed."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in peaks.items():
            if key in name:
                return peak
    return None


def dense_peak(device: torch.device, best_tflops: float) -> float:
    """The device's dense bf16 peak: its datasheet's where known, else the best rate
    measured over 0.8 (large matmuls' usual share of peak)."""
    known = _known(device, KNOWN_PEAKS)
    return best_tflops / 0.8 if known is None else known


def fp8_peak(device: torch.device) -> float:
    """The device's dense FP8 peak, 0 where it is not known (or has none)."""
    return _known(device, KNOWN_FP8_PEAKS) or 0.0


def low_precision_facts(device: torch.device) -> dict[str, float | bool]:
    """The [hardware] fields of this GPU's FP8 and FP4 tensor cores where known: their
    dense peaks, and MX formats on the GPUs with FP4; nothing for others."""
    out: dict[str, float | bool] = {}
    fp8, fp4 = fp8_peak(device), _known(device, KNOWN_FP4_PEAKS)
    if fp8:
        out["fp8_peak_tflops"] = fp8
    if fp4:
        out.update(fp4_peak_tflops=fp4, mxfp8=True)
    return out


def device_facts(device: torch.device) -> dict[str, float | int]:
    """What a GPU reports of itself for [hardware]: its memory and its SMs (which
    price the SMs DeepEP's kernels hold); nothing on CPU."""
    if device.type != "cuda":
        return {}
    props = torch.cuda.get_device_properties(device)
    return {"memory_bytes": float(props.total_memory), "sm_count": props.multi_processor_count}
