"""FP8 GEMMs against bf16 ones on this GPU: the check of ppsim.costs.fp8's one assumption.

ppsim prices an FP8 GEMM on the bf16 efficiency curve at the FP8 peak (1979 TFLOP/s on
H100 and H200, twice bf16's 989) scaled by [hardware] fp8_efficiency_ratio, so it takes
bf16's time x 989 / (1979 x ratio). This times both
at the per-rank shapes of the Llama 3 70B (tp 4) and 405B (tp 8) linears, sequence 8192,
after `--sustained` seconds of a large bf16 matmul bring the GPU to the clock a training
job holds, each the mean over back-to-back runs (torch._scaled_mm, e4m3 operands with
per-tensor scales, bf16 out: Transformer Engine's tensorwise GEMM). It prints each
shape's TFLOP/s, the FP8 / bf16 ratio, and the FP8 share of its peak against bf16's;
then the mean of those shares' ratios, the figure for [hardware] fp8_efficiency_ratio.

Run (a GPU with FP8 tensor cores, sm_89 or later):
    python benchmarks/bench_fp8_gemm.py --device cuda [--sustained 8]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from ppsim.executor.devices import dense_peak, fp8_peak
from ppsim.executor.hwprofile import _window_timer, warm_up

TOKENS = 8192
SHAPES = {  # (m, n, k) of the forward GEMM per rank: tokens x out x in
    "70B tp4 qkv": (TOKENS, 10240 // 4, 8192), "70B tp4 proj": (TOKENS, 8192, 8192 // 4),
    "70B tp4 fc1": (TOKENS, 2 * 28672 // 4, 8192), "70B tp4 fc2": (TOKENS, 8192, 28672 // 4),
    "405B tp8 qkv": (TOKENS, 18432 // 8, 16384), "405B tp8 fc1": (TOKENS, 2 * 53248 // 8, 16384),
    "405B tp8 fc2": (TOKENS, 16384, 53248 // 8),
}


@dataclass(frozen=True, kw_only=True)
class Timed:
    bf16_tflops: float
    fp8_tflops: float


def time_shape(device: torch.device, m: int, n: int, k: int, window_ms: float) -> Timed:
    run = _window_timer(device, window_ms)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    bf16_ms = run(lambda: a @ b.t(), 5)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device=device, dtype=torch.float32)
    fp8_ms = run(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,  # noqa: SLF001
                                          out_dtype=torch.bfloat16), 5)
    flops = 2.0 * m * n * k
    return Timed(bf16_tflops=flops / (bf16_ms * 1e9), fp8_tflops=flops / (fp8_ms * 1e9))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--sustained", type=float, default=8.0, help="seconds of warm-up")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available() \
            or torch.cuda.get_device_capability(device) < (8, 9):
        print("needs a CUDA GPU with FP8 tensor cores (sm_89 or later): nothing timed")
        return
    settled = warm_up(device, torch.bfloat16, args.sustained)
    bf16_peak = dense_peak(device, settled)
    fp8 = fp8_peak(device) or 2 * bf16_peak
    print(f"{torch.cuda.get_device_name(device)}: settled at {settled:.0f} TFLOP/s bf16; "
          f"peaks {bf16_peak:g} / {fp8:g} (bf16 / FP8; priced ratio "
          f"{fp8 / bf16_peak:.2f})")
    print(f"{'GEMM':14} {'m x n x k':>20} {'bf16':>6} {'FP8':>6} {'ratio':>6} "
          f"{'bf16 %':>6} {'FP8 %':>6}")
    shares = []
    for name, (m, n, k) in SHAPES.items():
        t = time_shape(device, m, n, k, 200.0)
        shares.append((t.fp8_tflops / fp8) / (t.bf16_tflops / bf16_peak))
        print(f"{name:14} {f'{m}x{n}x{k}':>20} {t.bf16_tflops:6.0f} {t.fp8_tflops:6.0f} "
              f"{t.fp8_tflops / t.bf16_tflops:6.2f} {t.bf16_tflops / bf16_peak:6.1%} "
              f"{t.fp8_tflops / fp8:6.1%}")
    print(f"fp8_efficiency_ratio = {sum(shares) / len(shares):.3f}  (FP8's share of its peak "
          "over bf16's, the mean over the shapes)")


if __name__ == "__main__":
    main()
