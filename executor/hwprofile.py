"""Measure the roofline figures of this device: a [hardware] table for a config.

A handful of matmul shapes (the efficiency curve), FlashAttention
(scaled_dot_product_attention, causal) at a few sequence lengths, a copy for
memory bandwidth, and the executor's layer at a tiny width for the host's time
per op. On a GPU it takes well under a minute; on CPU the sizes are small.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ppsim.costs.layerops import layer_ops
from ppsim.executor.builders.gpt import build
from ppsim.executor.builders.llama import architecture

# Dense bf16 peaks (TFLOP/s) of GPUs we know; others use the best measured rate / 0.8.
KNOWN_PEAKS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0,
               "B200": 2250.0}

GPU_MATMULS = [(256, 256, 256), (1024, 1024, 1024), (2048, 2048, 2048), (2048, 6144, 2048),
               (4096, 4096, 4096), (8192, 4096, 14336), (8192, 8192, 8192)]
CPU_MATMULS = [(32, 32, 32), (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512)]


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int], float]:
    def run(fn: Callable[[], Any], reps: int) -> float:
        """Median ms of `fn` over reps, after two warm-ups."""
        times = []
        for i in range(reps + 2):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return run


def _peak(device: torch.device, best_tflops: float) -> float:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in KNOWN_PEAKS.items():
            if key in name:
                return peak
    return best_tflops / 0.8


def measure_matmuls(device: torch.device, dtype: torch.dtype, reps: int) -> list[dict]:
    run = _timer(device)
    out = []
    for m, n, k in GPU_MATMULS if device.type == "cuda" else CPU_MATMULS:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        ms = run(lambda a=a, b=b: a @ b, reps)
        out.append({"shape": [m, n, k], "gflop": 2 * m * n * k / 1e9,
                    "tflops": 2 * m * n * k / (ms * 1e9), "ms": ms})
    return out


def measure_attention(device: torch.device, dtype: torch.dtype, reps: int) -> list[dict]:
    """Causal SDPA forward and backward; FLOPs as FlashAttention counts them (half the
    s x s scores)."""
    run = _timer(device)
    heads, hd, lengths = (32, 128, (1024, 4096, 8192)) if device.type == "cuda" \
        else (4, 32, (64, 128, 256))
    out = []
    for s in lengths:
        q, k, v = (torch.randn(1, heads, s, hd, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        flops = 2 * s * s * heads * hd  # 4 s^2 (heads x hd), halved by the causal mask
        fwd = run(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                  reps)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(y)

        def both(q=q, k=k, v=v, g=g) -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

        bwd = max(run(both, reps) - fwd, 1e-6)
        out.append({"seq_length": s, "flops": flops, "forward_ms": fwd, "backward_ms": bwd,
                    "forward_tflops": flops / (fwd * 1e9),
                    "backward_tflops": 2.5 * flops / (bwd * 1e9)})
    return out


def measure_bandwidth(device: torch.device, reps: int) -> float:
    """GB/s of a large copy (read + write)."""
    n = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _timer(device)(lambda: dst.copy_(src), reps)
    return 2 * n / (ms * 1e6)


def measure_kernel_overhead(device: torch.device) -> float:
    """Host microseconds per modelled op: the executor's own decoder layer at a tiny width
    (device time ~0), forward and backward, over the ops the roofline counts for it
    (ppsim.layerops). Eager PyTorch spends this in Python modules, dispatch and
    autograd for every op, so a small model's layer is host-bound."""
    fields = {"num_layers": 1, "hidden_size": 64, "num_heads": 2, "num_kv_heads": 2,
              "ffn_hidden_size": 256, "vocab_size": 128, "seq_length": 16,
              "micro_batch_size": 1, "gated_mlp": False, "norm": "layernorm",
              "position": "learned", "dtype": "bf16" if device.type == "cuda" else "fp32"}
    builder = build(fields)
    layer = builder.layer(0).to(device=device, dtype=builder.dtype)
    x = torch.randn(*builder.activation_shape, device=device, dtype=builder.dtype,
                    requires_grad=True)

    def step() -> None:
        layer(x).sum().backward()

    ops = len(layer_ops(architecture(fields), "dense"))
    return _timer(device)(step, 20) * 1e3 / (2 * ops)  # a forward and a backward kernel each


def measure_hardware(device_kind: str = "cpu", reps: int = 10) -> dict[str, Any]:
    """The measurements and the [hardware] table they make."""
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    mm = measure_matmuls(device, dtype, reps)
    peak = _peak(device, max(x["tflops"] for x in mm))
    att = measure_attention(device, dtype, reps)
    bw = measure_bandwidth(device, reps)
    overhead = measure_kernel_overhead(device)
    # Attention's figure: forward and backward together, at the longest length.
    last = att[-1]
    att_tflops = 3.5 * last["flops"] / ((last["forward_ms"] + last["backward_ms"]) * 1e9)
    att_eff = att_tflops / peak
    hw = {"peak_tflops": round(peak, 3),
          "matmul_efficiency": [[round(x["gflop"], 4), round(min(1.0, x["tflops"] / peak), 4)]
                                for x in sorted(mm, key=lambda x: x["gflop"])],
          "attention_efficiency": round(min(1.0, att_eff), 4),
          "memory_bandwidth_gbps": round(bw, 1), "kernel_overhead_us": round(overhead, 2)}
    if device.type == "cuda":
        hw["memory_bytes"] = float(torch.cuda.get_device_properties(device).total_memory)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch_version": torch.__version__, "hardware": hw,
            "measurements": {"matmuls": mm, "attention": att, "copy_gbps": bw,
                             "kernel_overhead_us": overhead,
                             "seconds": time.perf_counter() - t0}}


def hardware_toml(result: dict[str, Any]) -> str:
    """A [hardware] table to paste into a config (or use as one with --config)."""
    hw = result["hardware"]
    lines = [f"# Measured by ppsim profile --hardware-out on {result['device']} "
             f"(torch {result['torch_version']}).", "[hardware]"]
    for key, v in hw.items():
        if key == "matmul_efficiency":
            v = "[" + ", ".join(f"[{g}, {e}]" for g, e in v) + "]"
        lines.append(f"{key} = {v}")
    return "\n".join(lines) + "\n"
