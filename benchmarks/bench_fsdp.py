"""FSDP against torchtitan's published runs (held out: nothing fitted).

torchtitan's benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3: Llama 3.1 8B,
FSDP over 8 and over 128 H100s, local batch 2 (sequence 8192), global batch 16 and 256,
torchtitan's selective activation checkpointing, eager: 5,762 and 5,605 tokens/s per GPU,
82.4 and 67.0 GiB peak.

What ppsim can check of them:
- the sharded state: the two runs differ only in how many ranks shard the weights,
  gradients and Adam's moments (16 bytes a parameter / 8 against / 128), so the
  difference of their peaks is that of ppsim's static bytes, whatever the activations;
- the peaks themselves lie between ppsim's with Megatron's selective recompute (keeps
  more than torchtitan's per-op policy, which recomputes every other matmul) and with
  full recompute (keeps less);
- tokens/s per GPU: printed beside the published ones, not a target. Those GPUs ran at
  500 W with HBM2e (the h100-80gb preset is the 700 W SXM with HBM3), eager, and with
  torchtitan's per-op checkpointing, none of which ppsim's compute rates hold.

Then (without --quick) `ppsim plan --gpus --fsdp` at scale: the 405B preset on 8,192 GPUs
and DeepSeek-V3 on 2,048, as bench_job.py plans them with the distributed optimizer; the
405B with the sharding searched (`--search sharding`, bench_job.py's overlaps on); and
Megatron-FSDP (`--use-megatron-fsdp`): Llama 3 70B on 64 GPUs at sequence 8,192 beside
the distributed optimizer, and the 405B on 8,192.

Run: .venv/bin/python benchmarks/bench_fsdp.py [--quick]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from bench_job import plan_case

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

GIB = 2 ** 30


@dataclass(frozen=True, kw_only=True)
class TorchtitanRun:
    gpus: int
    tokens_per_gpu: float
    """Published TPS/GPU (FSDP, no torch.compile, no Float8)."""
    peak_gib: float
    """Published peak memory."""


RUNS = [TorchtitanRun(gpus=8, tokens_per_gpu=5762, peak_gib=82.4),
        TorchtitanRun(gpus=128, tokens_per_gpu=5605, peak_gib=67.0)]


@dataclass(frozen=True, kw_only=True)
class Predicted:
    static_gib: float
    peak_gib: float
    tokens_per_gpu: float


def predict(run: TorchtitanRun, recompute: str) -> Predicted:
    cfg = config_from_dict({
        "model": {"preset": "llama3-8b", "micro_batch_size": 2, "dp": run.gpus,
                  "fsdp": True, "recompute": recompute},
        "pipeline": {"pp": 1, "global_batch_size": 2 * run.gpus},
        "hardware": {"preset": "h100-80gb", "memory_bytes": 96 * GIB}})
    problem = build_problem(cfg)
    summary = simulate(problem, record=False).summary
    rank = summary.ranks[0]
    job = problem.hardware.job
    assert job is not None
    tp = job.throughput(summary.iteration_time_ms)
    assert tp is not None
    return Predicted(static_gib=rank.static_bytes / GIB, peak_gib=rank.peak_memory_bytes / GIB,
                     tokens_per_gpu=tp.tokens_per_s_per_gpu)


def main() -> None:
    sel = {r.gpus: predict(r, "selective") for r in RUNS}
    full = {r.gpus: predict(r, "full") for r in RUNS}
    few, many = RUNS
    published = few.peak_gib - many.peak_gib
    ours = sel[few.gpus].static_gib - sel[many.gpus].static_gib
    print("Llama 3.1 8B, FSDP, local batch 2 x 8192 (torchtitan, Dec 2024), h100-80gb preset")
    print(f"sharded state, {few.gpus} GPUs minus {many.gpus}: ppsim {ours:.2f} GiB, "
          f"published peaks {published:.2f} GiB ({ours / published - 1:+.1%})")
    print(f"{'GPUs':>5} {'peak: full':>10} {'published':>9} {'selective':>9}   "
          f"{'tok/s/GPU: full':>15} {'selective':>9} {'published':>9}")
    for r in RUNS:
        print(f"{r.gpus:5} {full[r.gpus].peak_gib:10.1f} {r.peak_gib:9.1f} "
              f"{sel[r.gpus].peak_gib:9.1f}   {full[r.gpus].tokens_per_gpu:15,.0f} "
              f"{sel[r.gpus].tokens_per_gpu:9,.0f} {r.tokens_per_gpu:9,.0f}")
    if "--quick" in sys.argv:
        return
    plan_case("llama3.1-405b on 8,192 H100, FSDP", [
        "--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--gpus", "8192",
        "--global-batch-size", "2048", "--fsdp"])
    plan_case("llama3.1-405b on 8,192 H100, sharding searched", [
        "--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--gpus", "8192",
        "--global-batch-size", "2048", "--overlap-grad-reduce", "--overlap-param-gather",
        "--tp-comm-overlap", "--search", "sharding"])
    plan_case("deepseek-v3 on 2,048 H100, FSDP", [
        "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--gpus", "2048",
        "--global-batch-size", "15360", "--fsdp"])
    seq = ["--preset", "llama3-70b", "--hardware", "h100-80gb", "--gpus", "64",
           "--global-batch-size", "256", "--seq-length", "8192"]
    for label, flags in (("Megatron-FSDP", ["--use-megatron-fsdp"]),
                         ("the distributed optimizer", ["--use-distributed-optimizer",
                                                        "--overlap-grad-reduce",
                                                        "--overlap-param-gather"])):
        plan_case(f"llama3-70b on 64 H100, sequence 8,192, {label}", [*seq, *flags])
    plan_case("llama3.1-405b on 8,192 H100, Megatron-FSDP", [
        "--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--gpus", "8192",
        "--global-batch-size", "2048", "--use-megatron-fsdp"])


if __name__ == "__main__":
    main()
