"""GEMMs on the SMs a communication kernel leaves: the check of `[hardware] collective_sms`.

ppsim prices each millisecond of a data-parallel collective hidden behind compute at
collective_sms / sm_count of a millisecond (16 of an H100's 132: NCCL's channels, an SM
each), as if the compute beside it ran at (sm_count - collective_sms) / sm_count of its
rate. This times the weight GEMMs of Megatron's weak-scaling models (bench_job.py's
target rows, per tensor-parallel rank, sequence 4096) on every SM and with
`--sms` SMs carved out of cuBLAS (torch._C._set_sm_carveout_experimental, on the
cuBLASLt path), after `--sustained` seconds of a large matmul settle the clock, each the
mean over back-to-back runs. It prints each model's slowdown over its distinct GEMMs'
summed time against the priced one, sm_count / (sm_count - sms) - 1. The carveout leaves
memory bandwidth and L2 alone, so it measures the SM share only; a slowdown of 0 means
this torch's GEMMs ignore the carveout (nothing measured).

Run (a GPU): python benchmarks/bench_sm_share.py --device cuda [--sms 16] [--sustained 8]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
from bench_job import WEAK, run_config

from ppsim.executor.hwprofile import _window_timer, model_matmuls, warm_up


@dataclass(frozen=True, kw_only=True)
class Slowdown:
    """One model's GEMMs with and without the carveout."""

    name: str
    full_ms: float
    """Its distinct GEMMs' summed time on every SM."""
    carved_ms: float
    """The same with the SMs carved out."""

    @property
    def slowdown(self) -> float:
        return self.carved_ms / self.full_ms - 1 if self.full_ms else 0.0


def _carve(sms: int | None) -> None:
    torch._C._set_sm_carveout_experimental(sms)  # noqa: SLF001


def time_model(device: torch.device, name: str, shapes: list[tuple[int, int, int]],
               sms: int, window_ms: float) -> Slowdown:
    run = _window_timer(device, window_ms)
    full = carved = 0.0
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        _carve(None)
        full += run(lambda a=a, b=b: a @ b, 5)
        _carve(sms)
        carved += run(lambda a=a, b=b: a @ b, 5)
    _carve(None)
    return Slowdown(name=name, full_ms=full, carved_ms=carved)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--sms", type=int, default=16, help="SMs carved out (NCCL's channels)")
    p.add_argument("--sustained", type=float, default=8.0, help="seconds of warm-up")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print("bench_sm_share: --device: needs a CUDA GPU (the carveout is cuBLAS's)",
              file=sys.stderr)
        return 2
    if not hasattr(torch._C, "_set_sm_carveout_experimental"):  # noqa: SLF001
        print(f"bench_sm_share: torch {torch.__version__} has no SM carveout: nothing timed",
              file=sys.stderr)
        return 2
    count = torch.cuda.get_device_properties(device).multi_processor_count
    if not 0 < args.sms < count:
        print(f"bench_sm_share: --sms: give 1 to {count - 1} (this GPU has {count} SMs)",
              file=sys.stderr)
        return 2
    torch.backends.cuda.preferred_blas_library("cublaslt")  # where the carveout applies
    settled = warm_up(device, torch.bfloat16, args.sustained)
    priced = count / (count - args.sms) - 1
    print(f"{torch.cuda.get_device_name(device)}: {count} SMs, settled at {settled:.0f} "
          f"TFLOP/s; {args.sms} carved out, priced slowdown {priced:+.1%}")
    print(f"{'model':8} {'GEMMs':>5} {'all SMs ms':>10} {'carved ms':>10} {'slowdown':>9}")
    for run in WEAK:
        shapes = model_matmuls(run_config(run).model.arch)
        s = time_model(device, run.name, shapes, args.sms, 200.0)
        print(f"{s.name:8} {len(shapes):5} {s.full_ms:10.3f} {s.carved_ms:10.3f} "
              f"{s.slowdown:+9.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
