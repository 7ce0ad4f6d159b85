"""Peak memory against Megatron-LM's own release tests on DGX H100 (and one on GB200),
held out.

Megatron-LM's functional tests record, for each release run, what the last rank's
tensorboard logs every step: `mem-allocated-bytes` (torch.cuda.memory_allocated after the
step: weights, gradients and optimizer state) and `mem-max-allocated-bytes`
(torch.cuda.max_memory_allocated: the peak). NVIDIA/Megatron-LM
tests/functional_tests/test_cases/<run>/golden_values_dev_dgx_h100.json (_dgx_gb200) and
the run's model_config.yaml (the mirror's main of 2026-08-22, commit d98e8a64dd); the
medians over the logged steps are below. The runs' node counts live in internal recipes,
so their data-parallel size is not published: each run is priced at every size its expert
layout allows (tp x dp a multiple of etp x ep), and its activation part (the peak less
the state) does not depend on it. Four configs were also run a second time (the `_sm`
cases: the same MODEL_ARGS, a shorter run); their goldens show how far one config's
logged peak moves between runs. Nothing is fitted.

Run: .venv/bin/python benchmarks/bench_release_memory.py
"""

from __future__ import annotations

from dataclasses import dataclass

from bench_job import ppsim_json


@dataclass(frozen=True, kw_only=True)
class ReleaseRun:
    name: str
    """The test case's folder."""
    flags: str
    """Its model_config.yaml's MODEL_ARGS that shape an iteration (learning rate, data,
    checkpoints and logging left out), as Megatron's flags."""
    vocab: int
    """Its tokenizer's vocabulary: Llama2Tokenizer 32,000; nemotron_2_256k 256,000."""
    dps: tuple[int, ...]
    """The data-parallel sizes its layout allows, a few."""
    static_bytes: float
    """Median mem-allocated-bytes."""
    peak_bytes: float
    """Median mem-max-allocated-bytes."""
    global_batch: int = 0
    """Where the config ramps its batch (--step-batch-size-schedule), its first size."""
    again: Golden | None = None
    """The same MODEL_ARGS run again (the `<name>_sm` case: a shorter run), its goldens."""
    hardware: str = "h100-80gb"
    """The ppsim preset of the machine its goldens name (golden_values_dev_dgx_h100.json:
    DGX H100; _dgx_gb200: GB200 NVL72)."""


@dataclass(frozen=True, kw_only=True)
class Golden:
    """Another release case's medians, its goldens' last change of values."""
    name: str
    changed: str
    static_bytes: float
    peak_bytes: float


DENSE = "--attention-dropout 0.0 --hidden-dropout 0.0 --bf16 --disable-bias-linear"
MIXTRAL = ("--untie-embeddings-and-output-weights --position-embedding-type rope "
           "--normalization RMSNorm --swiglu --group-query-attention --num-query-groups 8 "
           "--seq-length 4096 --make-vocab-size-divisible-by 128 --num-experts 8 "
           "--moe-router-topk 2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall "
           "--use-distributed-optimizer --sequence-parallel --micro-batch-size 1 " + DENSE)
MIXTRAL_8X7B = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
                "--num-attention-heads 32 " + MIXTRAL)
DEEPSEEK_PROXY = ("--expert-tensor-parallel-size 1 --use-distributed-optimizer "
                  "--sequence-parallel --global-batch-size 512 --seq-length 4096 "
                  "--num-layers 14 --hidden-size 7168 --ffn-hidden-size 18432 "
                  "--num-attention-heads 128 --kv-channels 128 --position-embedding-type rope "
                  "--make-vocab-size-divisible-by 3232 --normalization RMSNorm --swiglu "
                  "--untie-embeddings-and-output-weights --multi-latent-attention "
                  "--mtp-num-layers 1 --qk-layernorm --num-experts 64 "
                  "--moe-layer-freq ([0]*3+[1]*11) --moe-ffn-hidden-size 2048 "
                  "--moe-shared-expert-intermediate-size 2048 --moe-router-topk 8 "
                  "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
                  "--moe-grouped-gemm --moe-permute-fusion --q-lora-rank 1536 "
                  "--kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
                  "--v-head-dim 128 " + DENSE)
"""The two DeepSeek-V3 proxies' MODEL_ARGS but their parallel sizes and micro-batch."""
RUNS = [
    ReleaseRun(name="gpt3_15b_8t_release", vocab=256_000, dps=(8, 16, 32), global_batch=384,
               static_bytes=13_269_043_200, peak_bytes=28_160_194_560,
               again=Golden(name="gpt3_15b_8t_release_sm", changed="2026-03-12",
                            static_bytes=13_268_858_880, peak_bytes=28_157_253_632),
               flags="--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 "
                     "--use-distributed-optimizer --sequence-parallel --micro-batch-size 4 "
                     "--apply-layernorm-1p --untie-embeddings-and-output-weights "
                     "--position-embedding-type rope --squared-relu --num-layers 32 "
                     "--hidden-size 6144 --num-attention-heads 48 --group-query-attention "
                     "--num-query-groups 8 --seq-length 4096 " + DENSE),
    ReleaseRun(name="mixtral_8x7b_tp1pp4ep8vpp8_release", vocab=32_000, dps=(4, 8, 16),
               static_bytes=19_743_387_648, peak_bytes=35_505_844_224,
               flags="--pipeline-model-parallel-size 4 --tensor-model-parallel-size 2 "
                     "--expert-tensor-parallel-size 1 --num-layers-per-virtual-pipeline-stage 1 "
                     "--global-batch-size 256 --expert-model-parallel-size 8 " + MIXTRAL_8X7B),
    ReleaseRun(name="mixtral_8x22b_tp2pp8ep8vpp1_release", vocab=32_000, dps=(8, 16),
               static_bytes=23_002_929_152, peak_bytes=28_533_706_752,
               flags="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 "
                     "--global-batch-size 256 --num-layers 56 --hidden-size 6144 "
                     "--ffn-hidden-size 16384 --num-attention-heads 48 "
                     "--expert-model-parallel-size 8 " + MIXTRAL),
    ReleaseRun(name="mixtral_8x7b_alltoall_tp2pp4ep4_release", vocab=256_000, dps=(4, 8, 16),
               static_bytes=17_703_634_944, peak_bytes=25_444_866_048,
               again=Golden(name="mixtral_8x7b_alltoall_tp2pp4ep4_release_sm",
                            changed="2025-09-04", static_bytes=17_703_634_944,
                            peak_bytes=27_638_417_408),
               flags="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                     "--global-batch-size 1024 --expert-model-parallel-size 4 " + MIXTRAL_8X7B),
    ReleaseRun(name="deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release", vocab=256_000,
               dps=(4, 8, 16), static_bytes=58_533_744_640, peak_bytes=100_219_404_288,
               hardware="gb200-186gb",
               again=Golden(name="deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release_sm",
                            changed="2026-06-18", static_bytes=58_583_842_816,
                            peak_bytes=121_248_702_464),
               flags="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                     "--pipeline-model-parallel-layout Et*7|t*7mL "
                     "--expert-model-parallel-size 8 --micro-batch-size 4 " + DEEPSEEK_PROXY),
    ReleaseRun(name="deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release", vocab=256_000,
               dps=(8, 16), static_bytes=33_395_556_352, peak_bytes=46_151_041_024,
               again=Golden(name="deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm",
                            changed="2026-06-18", static_bytes=33_393_856_512,
                            peak_bytes=51_403_526_144),
               flags="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                     "--pipeline-model-parallel-layout Et*2|(tt|)*5t|tmL "
                     "--expert-model-parallel-size 16 --micro-batch-size 1 " + DEEPSEEK_PROXY),
]


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    static_bytes: float
    peak_bytes: float


def last_rank(run: ReleaseRun, dp: int) -> RankMemory:
    """ppsim's state and peak of the run's last rank (the one that logs) at `dp`."""
    batch = ["--global-batch-size", str(run.global_batch)] if run.global_batch else []
    sim = ppsim_json(["simulate", "--hardware", run.hardware, "--vocab-size", str(run.vocab),
                      *run.flags.split(), *batch, "--dp", str(dp), "--json"])
    rank = sim["ranks"][-1]
    return RankMemory(static_bytes=rank["static_bytes"], peak_bytes=rank["peak_memory_bytes"])


def main() -> None:
    print(f"{'run':42} {'dp':>3} {'state GB':>8} {'logged':>7} {'peak GB':>7} {'logged':>7} "
          f"{'peak - state':>12} {'logged':>7} {'error':>7}")
    for run in RUNS:
        logged = run.peak_bytes - run.static_bytes
        for dp in run.dps:
            ours = last_rank(run, dp)
            static, peak = ours.static_bytes, ours.peak_bytes
            print(f"{run.name:42} {dp:3} {static / 1e9:8.2f} {run.static_bytes / 1e9:7.2f} "
                  f"{peak / 1e9:7.2f} {run.peak_bytes / 1e9:7.2f} {(peak - static) / 1e9:12.2f} "
                  f"{logged / 1e9:7.2f} {(peak - static) / logged - 1:+7.1%}")
        if run.again:  # the activation part does not depend on dp: the last one's
            g = run.again
            again, ours = g.peak_bytes - g.static_bytes, peak - static
            print(f"  the same run again ({g.name}, goldens of {g.changed}): state "
                  f"{g.static_bytes / 1e9:.2f} GB, activation part {again / 1e9:.2f} GB "
                  f"against ppsim's {ours / 1e9:.2f}: {ours / again - 1:+.1%}")


if __name__ == "__main__":
    main()
