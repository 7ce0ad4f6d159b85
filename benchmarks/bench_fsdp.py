"""FSDP against torchtitan's published runs (held out: nothing fitted).

torchtitan's benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3: Llama 3.1 8B,
FSDP over 8 and over 128 H100s, local batch 2 (sequence 8192), global batch 16 and 256,
torchtitan's selective activation checkpointing, eager: 5,762 and 5,605 tokens/s per GPU,
82.4 and 67.0 GiB peak.

What ppsim can check of them:
- the sharded state: the two runs differ only in how many ranks shard the weights,
  gradients and Adam's moments (16 bytes a parameter / 8 against / 128), so the
  difference of their peaks is that of ppsim's static bytes, whatever the activations;
- the peaks themselves against ppsim's with torchtitan's per-op policy (`--recompute
  op-sac`), beside full recompute (keeps less) and Megatron's selective (keeps more);
- tokens/s per GPU: printed beside the published ones, not a target. Those GPUs ran at
  500 W with HBM2e (the h100-80gb preset is the 700 W SXM with HBM3), eager, which
  ppsim's compute rates do not hold.

Then Megatron-LM's own FP8 example of Megatron-FSDP,
examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh (Llama 3 8B on one 8-GPU node,
sequence 8,192, global batch 128, --fp8-format hybrid --fp8-param-gather), priced as
written beside the same line in bf16: no published figure, the prediction a user gets.

Then (without --quick) `ppsim plan --gpus --fsdp` at scale: the 405B preset on 8,192 GPUs
and DeepSeek-V3 on 2,048, as bench_job.py plans them with the distributed optimizer; the
405B with the sharding searched (`--search sharding`, bench_job.py's overlaps on); and
Megatron-FSDP (`--use-megatron-fsdp`): Llama 3 70B on 64 GPUs at sequence 8,192 beside
the distributed optimizer, in bf16 and in FP8 (tensorwise, --fp8-param-gather), and the
405B on 8,192.

Run: .venv/bin/python benchmarks/bench_fsdp.py [--quick]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from bench_job import plan_case, ppsim_json

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


EXAMPLE = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads "
           "32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length "
           "8192 --max-position-embeddings 8192 --position-embedding-type rope --swiglu "
           "--normalization RMSNorm --untie-embeddings-and-output-weights "
           "--disable-bias-linear --vocab-size 128256 --attention-dropout 0.0 "
           "--hidden-dropout 0.0 --micro-batch-size 1 --global-batch-size 128 --bf16 "
           "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params "
           "--no-gradient-accumulation-fusion --ckpt-format fsdp_dtensor "
           "--fsdp-double-buffer --tensor-model-parallel-size 1 --context-parallel-size 1 "
           "--sequence-parallel --use-distributed-optimizer")
"""examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh's arguments that shape an
iteration (its tokenizer's vocabulary given); its FP8 ones in EXAMPLE_FP8."""
EXAMPLE_FP8 = "--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max " \
              "--fp8-param-gather"


def example(fp8: bool) -> Predicted:
    """Megatron's FP8 example of Megatron-FSDP on one 8-GPU node, or its line in bf16."""
    sim = ppsim_json(["simulate", "--hardware", "h100-80gb", "--gpus", "8", *EXAMPLE.split(),
                      *(EXAMPLE_FP8.split() if fp8 else []), "--json"])
    peak = max(r["peak_memory_bytes"] for r in sim["ranks"])
    return Predicted(tokens_per_gpu=sim["throughput"]["tokens_per_s_per_gpu"],
                     peak_gib=peak / 2**30, static_gib=0.0)


def main() -> None:
    sel = {r.gpus: predict(r, "selective") for r in RUNS}
    full = {r.gpus: predict(r, "full") for r in RUNS}
    sac = {r.gpus: predict(r, "op-sac") for r in RUNS}
    few, many = RUNS
    published = few.peak_gib - many.peak_gib
    ours = sel[few.gpus].static_gib - sel[many.gpus].static_gib
    print("Llama 3.1 8B, FSDP, local batch 2 x 8192 (torchtitan, Dec 2024), h100-80gb preset")
    print(f"sharded state, {few.gpus} GPUs minus {many.gpus}: ppsim {ours:.2f} GiB, "
          f"published peaks {published:.2f} GiB ({ours / published - 1:+.1%})")
    print(f"{'GPUs':>5} {'peak: full':>10} {'op-sac':>7} {'published':>9} {'selective':>9}"
          f"   {'tok/s/GPU: full':>15} {'op-sac':>7} {'selective':>9} {'published':>9}")
    for r in RUNS:
        print(f"{r.gpus:5} {full[r.gpus].peak_gib:10.1f} {sac[r.gpus].peak_gib:7.1f} "
              f"{r.peak_gib:9.1f} {sel[r.gpus].peak_gib:9.1f}   "
              f"{full[r.gpus].tokens_per_gpu:15,.0f} {sac[r.gpus].tokens_per_gpu:7,.0f} "
              f"{sel[r.gpus].tokens_per_gpu:9,.0f} {r.tokens_per_gpu:9,.0f}")
    fp8, bf16 = (example(fp8) for fp8 in (True, False))
    print(f"Megatron's Llama 3 8B FSDP example on 8 H100: FP8 {fp8.tokens_per_gpu:,.0f} "
          f"tokens/s/GPU, peak {fp8.peak_gib:.1f} GiB; bf16 {bf16.tokens_per_gpu:,.0f}, "
          f"peak {bf16.peak_gib:.1f} GiB; FP8 / bf16 "
          f"{fp8.tokens_per_gpu / bf16.tokens_per_gpu:.2f}")
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
    fp8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]
    for precision, extra in (("", []), (", FP8", fp8)):
        for label, flags in (("Megatron-FSDP", ["--use-megatron-fsdp"]),
                             ("the distributed optimizer", ["--use-distributed-optimizer",
                                                            "--overlap-grad-reduce",
                                                            "--overlap-param-gather"])):
            plan_case(f"llama3-70b on 64 H100, sequence 8,192{precision}, {label}",
                      [*seq, *flags, *extra])
    plan_case("llama3.1-405b on 8,192 H100, Megatron-FSDP", [
        "--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--gpus", "8192",
        "--global-batch-size", "2048", "--use-megatron-fsdp"])


if __name__ == "__main__":
    main()
