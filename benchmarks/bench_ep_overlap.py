"""Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm) against published H100
runs, held out: nothing is fitted to them.

yanring/Megatron-MoE-ModelZoo, best_practice/Qwen3/readme.md (Qwen3-235B-A22B, 256 H100,
NVLink 4, InfiniBand 8 x 50 GB/s, sequence 4096, bf16, recompute "norm, act":
--recompute-modules layernorm moe_act; best-practice/qwen3/run_235b.sh adds
--moe-router-force-load-balancing): step time and TFLOP/s per GPU of each row. The two
cross-node rows ran the DeepEP dispatcher (`--moe-token-dispatcher-type flex`: a token
crosses to each node once and is forwarded over NVLink), without and with "1f1b
overlap"; best_practice/qwen3/run_h100_235b.sh gives 320 TFLOP/s/GPU for the overlapped
job on a later Megatron (with CUDA graphs, not priced); the last row ran Megatron's
all-to-all dispatcher. The repository's
sbatch_benchmarking.sh adds --tp-comm-overlap to bf16 runs and --overlap-moe-expert-
parallel-comm --delay-wgrad-compute for "1f1b overlap". Each is priced on the h100-80gb
preset with those and the distributed optimizer's overlaps, the DeepEP rows also as if
they had run the all-to-all.

Then (without --quick) `ppsim plan --gpus 256` for the same job with the flag.

Run: .venv/bin/python benchmarks/bench_ep_overlap.py [--quick]
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from dataclasses import dataclass

from bench_job import plan_case

from ppsim.cli.main import main as ppsim

COMMON = ["--preset", "qwen3-235b-a22b", "--hardware", "h100-80gb", "--gpus", "256",
          "--global-batch-size", "2048", "--micro-batch-size", "1", "--seq-length", "4096",
          "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
          "--tp-comm-overlap", "--recompute-granularity", "selective", "--recompute-modules",
          "layernorm", "moe_act"]
OVERLAP = "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"


@dataclass(frozen=True, kw_only=True)
class Row:
    name: str
    shape: str
    """The row's sizes as ppsim's flags."""
    tflops: float
    """Published TFLOP/s per GPU."""
    step_s: float = 0.0
    """Published step time; 0: not published."""


FLEX = "--moe-token-dispatcher-type flex"
ROWS = [
    Row(name="DeepEP, EP across nodes", shape=f"--tp 2 --pp 8 --vpp 4 --ep 32 {FLEX}",
        step_s=19.7, tflops=245),
    Row(name="  + 1f1b overlap", shape=f"--tp 2 --pp 8 --vpp 4 --ep 32 {FLEX} {OVERLAP}",
        step_s=17.6, tflops=276),
    # best_practice/qwen3/run_h100_235b.sh, "H100 config, 320 TFLOPS": the same job on a
    # later Megatron, with CUDA graphs of the router and the dispatcher's preprocessing.
    Row(name="  + later, CUDA graphs", shape=f"--tp 2 --pp 8 --vpp 4 --ep 32 {FLEX} {OVERLAP}",
        tflops=320),
    Row(name="A2A, EP in a node", shape="--tp 2 --pp 32 --vpp 3 --ep 8", step_s=24.2,
        tflops=200),
]


def price(shape: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ppsim(["simulate", *COMMON, *shape.split(), "--json"]) == 0, shape
    return json.loads(out.getvalue())


def main() -> None:
    print("Megatron-MoE-ModelZoo, Qwen3-235B-A22B on 256 H100 (held out); h100-80gb preset;")
    print("error: ppsim's TFLOP/s per GPU over the published (+: ppsim faster)")
    print(f"{'row':24} {'TFLOP/s':>7} {'ppsim':>6} {'error':>7} {'step s':>6} {'ppsim s':>8} "
          f"{'peak GB':>7} {'as all-to-all s':>15}")
    for row in ROWS:
        sim = price(row.shape)
        t = sim["iteration_time_ms"] / 1e3
        tf = sim["throughput"]["tflops_per_gpu"]
        peak = max(r["peak_memory_bytes"] for r in sim["ranks"]) / 1e9
        a2a = (f"{price(row.shape.replace(FLEX, ''))['iteration_time_ms'] / 1e3:15.2f}"
               if FLEX in row.shape else "")
        step = f"{row.step_s:6.1f}" if row.step_s else f"{'-':>6}"
        print(f"{row.name:24} {row.tflops:7.0f} {tf:6.0f} {tf / row.tflops - 1:+7.1%} {step} "
              f"{t:8.2f} {peak:7.1f} {a2a}")
    if "--quick" in sys.argv:
        return
    plan_case("qwen3-235b-a22b on 256 H100, DeepEP, combined 1F1B",
              [*COMMON[:8], *COMMON[12:16], *FLEX.split(), *OVERLAP.split()])


if __name__ == "__main__":
    main()
