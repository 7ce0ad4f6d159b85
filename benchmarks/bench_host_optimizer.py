"""The optimizer on the host (Megatron's --optimizer-cpu-offload). First the host's AdamW
as Megatron runs it (torch.optim.AdamW, fused=True, fp32 CPU tensors: megatron/core/
optimizer/__init__.py): the rate one core and every core of this machine reach, in
parameters a second, beside a copy's bandwidth; the per-core figure is the hardware
presets' host_core_adam_gparams. Then `ppsim plan` for DeepSeek-V3 on 128 H100s (global
batch 1,024), where no shape holds its weights and optimizer state: the search's time
and its best shapes with `--search host-optimizer`, and without it.

Run:    .venv/bin/python benchmarks/bench_host_optimizer.py [--params 64e6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = ["plan", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--gpus", "128",
        "--global-batch-size", "1024", "--top", "3", "--json"]


def plan(extra: list[str]) -> None:
    """One `ppsim plan` of PLAN, timed: its best shapes, or why none."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", *PLAN, *extra], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 3):
        raise SystemExit(out.stderr)
    res = json.loads(out.stdout)
    print(f"plan {' '.join(extra) or '(no --search)'}: {wall:.1f} s, "
          f"{res['evaluated']:,} of {res['total_shapes']:,} shapes simulated"
          + ("" if res["complete"] else " (cut by its time budget)"))
    fitting = [c for c in res["candidates"] if c["fits"]]
    if not fitting:
        print(f"  nothing fits (least weights and state: "
              f"{res['static_overflow']['static_bytes'] / 1e9:.1f} GB)")
    for c in fitting:
        folded = f" etp{c['etp']}" if c["etp"] != c["tp"] else ""
        print(f"  tp{c['tp']} cp{c['cp']} ep{c['ep']}{folded} pp{c['pp']} dp{c['dp']} "
              f"vpp{c['vpp']} "
              f"mbs{c['micro_batch_size']} host {c['optimizer_offload_fraction']:g}: "
              f"{c['iteration_time_ms'] / 1e3:.1f} s, "
              f"{c['throughput']['tflops_per_gpu']:.0f} TFLOP/s/GPU, "
              f"peak {c['peak_memory_bytes'] / 1e9:.1f} GB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=64e6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--adam-only", action="store_true", help="skip the plans")
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
    if not args.adam_only:
        plan([])
        plan(["--search", "host-optimizer"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
