"""The host's AdamW, as Megatron's --optimizer-cpu-offload steps it: torch.optim.AdamW
with fused=True on fp32 CPU tensors (megatron/core/optimizer/__init__.py), the rate one
core and every core of this machine reach, in parameters a second, beside a copy's
bandwidth. The per-core figure is the hardware presets' host_core_adam_gparams; whether
it scales with threads or stops at the memory's bandwidth is what the table shows.

Run:    .venv/bin/python benchmarks/bench_cpu_adam.py [--params 64e6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ADAM_BYTES = 28
"""Fused AdamW reads the weight, its gradient and the two moments, writes the weight
and the moments: 7 fp32 words a parameter."""


def best_of(repeats: int, fn: object) -> float:
    """The least wall time of `repeats` calls, seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def measure(n: int, threads: int, repeats: int) -> tuple[float, float]:
    """(fused AdamW parameters a second, copy GB/s read plus written) on `threads`."""
    torch.set_num_threads(threads)
    weight = torch.nn.Parameter(torch.randn(n))
    weight.grad = torch.randn(n)
    opt = torch.optim.AdamW([weight], lr=1e-4, fused=True)
    opt.step()  # the moments exist from here on
    src, dst = torch.randn(n), torch.empty(n)
    adam = best_of(repeats, opt.step)
    copy = best_of(repeats, lambda: dst.copy_(src))
    return n / adam, 8 * n / copy / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=64e6)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = int(args.params)
    cores = os.cpu_count() or 1
    print(f"torch {torch.__version__}; {cores} cores; {n / 1e6:.0f}M fp32 parameters, "
          f"best of {args.repeats}")
    print(f"{'threads':>7} {'Gparams/s':>10} {'per core':>9} {'AdamW GB/s':>11} "
          f"{'copy GB/s':>10}")
    for threads in sorted({1, cores}):
        rate, copy = measure(n, threads, args.repeats)
        print(f"{threads:>7} {rate / 1e9:>10.3f} {rate / 1e9 / threads:>9.3f} "
              f"{rate * ADAM_BYTES / 1e9:>11.1f} {copy:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
