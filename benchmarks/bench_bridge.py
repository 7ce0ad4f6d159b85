"""Megatron-Bridge's published runs, held out (nothing is fitted to them): FP8 (--fp8-format,
ppsim.costs.fp8) on DGX-H100 and DGX-B200, and a BF16 MoE run on DGX-H100.

NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, "25.11 NeMo Container",
System DGX-H100, precision FP8-CS (Transformer Engine's current, tensorwise scaling):
tokens/s per GPU of each run, its shape as the table gives it (GBS, MBS, sequence, TP, PP,
CP, VP, EP). Each is priced as its flags say on the h100-80gb preset, with what the recipes
run (the distributed optimizer, --overlap-grad-reduce, --overlap-param-gather,
--tp-comm-overlap, --fp8-param-gather) and the presets' recompute mode; the same run in bf16 beside
it (no published counterpart: the speed-up ppsim predicts). The MoE row runs Megatron's
all-to-all dispatcher with the combined 1F1B, as its workload config says, force-balanced
as the table's note says.

The 25.11 DGX-B200 and DGX-GB200 runs in FP8-CS of a dense preset (Llama 3 8B, 3.1 405B)
check the b200-180gb and gb200-186gb presets the same way. Beside them the one BF16 run the
archive gives for a model ppsim has a preset of on DGX-H100 (26.02 NeMo container): GPT-OSS
120B on 64 GPUs, priced with its workload config (gpt_oss_workload_base_configs.py
H100_BF16_V2: GBS 1280, MBS 1, PP 4, EP 8, recompute of layernorm and moe_act) over its
recipe (recipes/gpt_oss: the all-to-all dispatcher, the distributed optimizer with both DP
overlaps, sequence 4096, the model from the Hugging Face config, vocabulary 201,088) and
the performance scripts' set_gpt_oss_common_configs (gradients reduced in bf16); again with
the matmul and attention rates measured on an H200 at other models' shapes (MEASURED). And
the archive's DGX-H100 FP8 run of Qwen3-30B-A3B (26.02.01 container), priced at the
archive's shape with its workload config's combined 1F1B: both fine-grained MoEs read far
above their published rates. And the 25.09 DGX-H100 FP8-CS run of DeepSeek-V3 on 1,024 GPUs
at its workload config (DeepEP, the combined 1F1B, mla_up_proj and mlp recomputed). And a
hybrid stack: the 26.06 DGX-H100 FP8-CS run of Nemotron 3 Nano (Mamba-2, MoE and attention
layers) at its workload config, with the FLOPs a token its published TFLOP/s imply beside
ppsim's count. And a hybrid stack without experts: NVIDIA's DGX Cloud Benchmarking run of
Nemotron-H 56B (Mamba-2, MLP and attention layers) on 128 H100 in FP8. And DeepSeek-V3
in MXFP8 on 256 B200 at Bridge's 25.11 workload config (B200_DEEPSEEK_RUN), and on 256
GB200 as Megatron-LM's own GB200 guide trains it (GB200_DEEPSEEK_RUN; in TFLOP/s per GPU,
the unit it was published in). And NVFP4
(--fp4-format e2m1) against MXFP8: the 26.04.01 DGX-GB200 runs of Llama 3 70B and 3.1
405B published in both at one shape (NVFP4_PAIRS).

Then (without --quick) `ppsim plan` of the B200 and GB200 DeepSeek-V3 runs' shapes
against their layouts, and `ppsim plan --gpus 8192` for the 405B preset in FP8, the plan time.

Run: .venv/bin/python benchmarks/bench_bridge.py [--quick]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench_job import MEASURED_KEYS, plan_case, ppsim_json

DP_OVERLAPS = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
               "--ddp-bucket-size", str(128 * 1024 * 1024)]
"""The data-parallel overlaps Bridge's CommOverlapConfig sets where dp > 1 (with its
128M-parameter buckets; src/megatron/bridge/training/comm_overlap.py). Its performance
scripts also gather the first chunk's weights beside the optimizer step where dp, pp and
vpp > 1 (--overlap-param-gather-with-optimizer-step: with_step)."""
OVERLAPS = [*DP_OVERLAPS, "--tp-comm-overlap"]
FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]


@dataclass(frozen=True, kw_only=True)
class BridgeRun:
    name: str
    preset: str
    gpus: int
    shape: str
    """The table's shape as ppsim's flags."""
    tokens_per_gpu: float
    """Published tokens/s per GPU."""
    hardware: str = "h100-80gb"
    tflops_per_gpu: float = 0.0
    """Published model TFLOP/s per GPU, where the line compares FLOPs a token (0: not)."""
    nvlink_domain: int = 0
    """GPUs the run placed in one NVLink domain, where its recipe sets fewer than the
    preset's (0: the preset's gpus_per_node)."""


def hardware_args(run: BridgeRun, folder: str) -> list[str]:
    """--hardware for `run`: its preset, or a [hardware] table in `folder` that places
    its NVLink domains as the run placed them."""
    if not run.nvlink_domain:
        return ["--hardware", run.hardware]
    path = Path(folder) / "domain.toml"
    path.write_text(f"[hardware]\npreset = {json.dumps(run.hardware)}\n"
                    f"gpus_per_node = {run.nvlink_domain}\n")
    return ["--hardware", str(path)]


RUNS = [
    BridgeRun(name="Llama 3 70B", preset="llama3-70b", gpus=64, tokens_per_gpu=1602,
              shape="--global-batch-size 128 --micro-batch-size 1 --tp 4 --pp 8 --vpp 5"),
    BridgeRun(name="Llama 3.1 405B", preset="llama3.1-405b", gpus=1024, tokens_per_gpu=292,
              shape="--global-batch-size 512 --micro-batch-size 1 --tp 8 --pp 8 --cp 2 "
                    "--vpp 8"),
    # Its workload config (qwen3_workload_base_configs.py, H100 V1) sets moe_a2a_overlap:
    # Bridge's set_moe_a2a_overlap_overrides turns on both flags below.
    BridgeRun(name="Qwen3-235B-A22B", preset="qwen3-235b-a22b", gpus=256, tokens_per_gpu=1575,
              shape="--global-batch-size 2048 --micro-batch-size 1 --seq-length 4096 --tp 2 "
                    "--pp 8 --vpp 4 --ep 32 --etp 1 --moe-token-dispatcher-type alltoall "
                    "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"),
]


@dataclass(frozen=True, kw_only=True)
class Priced:
    tokens_per_gpu: float
    tflops_per_gpu: float
    peak_gb: float


def _blackwell_runs(*, hardware: str, tokens_8b: float, gpus_405b: int, tokens_405b: float,
                    shape_405b: str) -> list[BridgeRun]:
    """One 25.11 Blackwell system's FP8-CS runs of the dense presets: Llama 3 8B on 8 GPUs
    (tp 1: no --tp-comm-overlap) and Llama 3.1 405B at its workload config's shape."""
    return [BridgeRun(name="Llama 3 8B", preset="llama3-8b", gpus=8, tokens_per_gpu=tokens_8b,
                      hardware=hardware,
                      shape="--global-batch-size 128 --micro-batch-size 2 --pp 1"),
            BridgeRun(name="Llama 3.1 405B", preset="llama3.1-405b", gpus=gpus_405b,
                      tokens_per_gpu=tokens_405b, hardware=hardware,
                      shape=f"{shape_405b} --tp-comm-overlap")]


B200_RUNS = _blackwell_runs(hardware="b200-180gb", tokens_8b=30624, gpus_405b=128,
                            tokens_405b=661, shape_405b="--global-batch-size 64 "
                            "--micro-batch-size 1 --tp 4 --pp 8 --cp 2 --vpp 8")
"""Held out for the b200-180gb preset: the 25.11 DGX-B200 runs in FP8-CS."""
GB200_RUNS = _blackwell_runs(hardware="gb200-186gb", tokens_8b=31508, gpus_405b=256,
                             tokens_405b=813, shape_405b="--global-batch-size 1536 "
                             "--micro-batch-size 1 --tp 4 --pp 16 --vpp 4")
"""Held out for the gb200-186gb preset: the 25.11 DGX-GB200 runs in FP8-CS (the 405B at
its workload config's V2 shape, LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V2)."""

MXFP8 = ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8", "--fp8-param-gather"]
NVFP4 = ["--fp4-format", "e2m1", "--fp4-param-gather"]
BF16_GRADS = ["--grad-reduce-in-bf16"]


@dataclass(frozen=True, kw_only=True)
class PrecisionPair:
    """One shape Bridge published in MXFP8 and in NVFP4 on one system."""

    run: BridgeRun
    """The shape, with the NVFP4 run's tokens/s per GPU."""
    mxfp8_tokens_per_gpu: float
    nvfp4_overlaps: list[str]
    """The DP and TP overlaps the NVFP4 recipe keeps (the MXFP8 one keeps all)."""


NVFP4_PAIRS = [
    PrecisionPair(run=BridgeRun(name="Llama 3 70B", preset="llama3-70b", gpus=64,
                                tokens_per_gpu=4864, hardware="gb200-186gb",
                                shape="--global-batch-size 256 --micro-batch-size 1 "
                                      "--seq-length 8192 --tp 2 --pp 4 --vpp 5"),
                  mxfp8_tokens_per_gpu=3712, nvfp4_overlaps=DP_OVERLAPS),
    PrecisionPair(run=BridgeRun(name="Llama 3.1 405B", preset="llama3.1-405b", gpus=256,
                                tokens_per_gpu=1184, hardware="gb200-186gb",
                                shape="--global-batch-size 1536 --micro-batch-size 1 "
                                      "--seq-length 8192 --tp 4 --pp 16 --vpp 8"),
                  mxfp8_tokens_per_gpu=800,
                  nvfp4_overlaps=[f for f in DP_OVERLAPS if f != "--overlap-param-gather"]),
]
"""Megatron-Bridge 26.04.01, DGX-GB200, the same shape in MXFP8 and NVFP4 (the nightly
performance summary), priced as the perf recipes set them (perf_recipes/llama/gb200:
gradients reduced in bf16; MXFP8 with its parameters gathered in FP8 and
--tp-comm-overlap; NVFP4 with --fp4-param-gather and no --tp-comm-overlap, the 405B also
without --overlap-param-gather; both NVFP4 runs replay CUDA graphs, which ppsim does not
price)."""


BF16_RUN = BridgeRun(name="GPT-OSS 120B", preset="gpt-oss-120b", gpus=64, tokens_per_gpu=5993,
                     shape="--global-batch-size 1280 --micro-batch-size 1 --seq-length 4096 "
                           "--pp 4 --ep 8 --moe-token-dispatcher-type alltoall "
                           "--recompute-modules layernorm moe_act --moe-grouped-gemm "
                           "--grad-reduce-in-bf16 --use-distributed-optimizer "
                           "--overlap-grad-reduce --overlap-param-gather")
"""Megatron-Bridge 26.02, DGX-H100, BF16 (tp 1: no --tp-comm-overlap)."""


SMALL_MOE_RUN = BridgeRun(name="Qwen3-30B-A3B", preset="qwen3-30b-a3b", gpus=16,
                          tokens_per_gpu=9058,
                          shape="--global-batch-size 1024 --micro-batch-size 1 --seq-length "
                                "4096 --pp 2 --vpp 12 --ep 8 --moe-token-dispatcher-type "
                                "alltoall --overlap-moe-expert-parallel-comm "
                                "--delay-wgrad-compute")
"""Megatron-Bridge 26.02.01, DGX-H100, FP8 (the archive's shape; its workload config,
QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS, sets moe_a2a_overlap and no CUDA graphs)."""


DEEPSEEK_RUN = BridgeRun(name="DeepSeek-V3", preset="deepseek-v3", gpus=1024,
                         tokens_per_gpu=1297,
                         shape="--global-batch-size 8192 --micro-batch-size 1 --tp 2 --pp 8 "
                               "--vpp 4 --ep 64 --etp 1 --recompute-granularity selective "
                               "--recompute-modules mla_up_proj mlp "
                               "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend "
                               "deepep --overlap-moe-expert-parallel-comm "
                               "--delay-wgrad-compute")
"""Megatron-Bridge 25.09, DGX-H100, FP8-CS (dropless, force-balanced), at its workload
config (DEEPSEEK_V3_PRETRAIN_CONFIG_H100_BASE_CONFIG: DeepEP, moe_a2a_overlap, recompute
of mla_up_proj and mlp), on ppsim's default split of the 32 virtual stages."""


NANO_RUN = BridgeRun(name="Nemotron 3 Nano", preset="nemotron-3-nano-30b-a3b", gpus=16,
                     tokens_per_gpu=14719, tflops_per_gpu=328,
                     shape="--global-batch-size 1024 --micro-batch-size 1 --seq-length 8192 "
                           "--pp 1 --ep 8 --recompute-granularity selective "
                           "--recompute-modules moe layernorm core_attn moe_act --moe-grouped-gemm "
                           "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend "
                           "deepep --grad-reduce-in-bf16")
"""Megatron-Bridge 26.06, DGX-H100, FP8-CS (14,336 to 14,890 over the 26.02.01 to 26.06
containers), at the workload config of that release (nemotron_3_workload_base_configs.py
NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1 and nemotron_3_llm_pretrain.py: ep 8,
recompute of moe, layernorm, core_attn and moe_act, force-balanced, gradients reduced in
bf16, first and last layers in FP8 too). Its HybridEP dispatcher is priced as DeepEP:
inside one node both are NVLink all-to-alls."""


HYBRID_DENSE_RUN = BridgeRun(name="Nemotron-H 56B", preset="nemotron-h-56b", gpus=128,
                             tokens_per_gpu=8192 * 384 / 11.874 / 128,
                             shape="--global-batch-size 384 --micro-batch-size 1 --tp 8 "
                                   "--pp 1 --recompute none")
"""NVIDIA's DGX Cloud Benchmarking recipe for Nemotron-H 56B (NVIDIA/dgxc-benchmarking
nemotron-h/README.md of release 25.08.01, commit 2fc17d4: the example run
pretrain_nemotronh_56b_fp8_gpus128_tp8_pp1_cp1_vpNone_mbs1_gbs384, 11.874 s a step over
iterations 35 to 44, std 0.027 s) on DGX-H100 in FP8 current scaling, NeMo 25.07.01: its
recipe (NeMo's nemotronh_56b.py in performance mode) keeps sequence parallelism, the
distributed optimizer, --overlap-grad-reduce without --overlap-param-gather, gradients
reduced in fp32, --tp-comm-overlap and no recompute."""
HYBRID_DENSE_OVERLAPS = ["--use-distributed-optimizer", "--overlap-grad-reduce",
                         "--tp-comm-overlap"]


B200_DEEPSEEK_RUN = BridgeRun(
    name="DeepSeek-V3", preset="deepseek-v3", gpus=256, hardware="b200-180gb",
    tokens_per_gpu=2139,
    shape="--global-batch-size 2048 --micro-batch-size 1 --seq-length 4096 --tp 1 --pp 16 "
          "--ep 8 --etp 1 --pipeline-model-parallel-layout Et*4|(t*4|)*14tmL "
          "--recompute-granularity selective --recompute-modules mla_up_proj "
          "--moe-token-dispatcher-type alltoall")
"""Megatron-Bridge 25.11, DGX-B200, FP8-MX, with MTP, at its workload config of that release
(deepseek_workload_base_configs.py of 2025-11-28, DEEPSEEK_V3_PRETRAIN_CONFIG_B200_BASE_CONFIG:
pp 16, ep 8, GBS 2048, mla_up_proj recomputed, no flex backend so the all-to-all
dispatcher, no a2a overlap; set_deepseek_v3_layout's (16, 1) layout; gradients reduced in
bf16, force-balanced)."""


GB200_DEEPSEEK_RUN = BridgeRun(
    name="DeepSeek-V3", preset="deepseek-v3", gpus=256, hardware="gb200-186gb",
    tokens_per_gpu=0.0, tflops_per_gpu=970.01, nvlink_domain=32,
    shape="--global-batch-size 2048 --micro-batch-size 1 --seq-length 4096 --tp 1 --pp 8 "
          "--ep 32 --etp 1 --pipeline-model-parallel-layout Et|(tt|)*30L --mtp-num-layers 0 "
          "--recompute-granularity selective --recompute-modules moe_act mlp --moe-grouped-gemm "
          "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
          "--moe-hybridep-num-sms 32 --use-precision-aware-optimizer --main-grads-dtype fp32 "
          "--main-params-dtype fp32 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
"""Megatron-LM's DeepSeek-V3 GB200 guide (docs/discussions/deepseek-v3-gb200-optimization/
deepseek-v3-gb200-reproduce-guide.md, its launch line; 970 TFLOP/s per GPU by Megatron's
count, as docs/advanced/index.md gives it, 970.01 in the optimization history the guide's
draft of 2025-10-30 published, from 494.46 before its steps): 256 GB200 in MXFP8, tp 1,
pp 8 over the layout's 32 virtual stages, ep 32, MBS 1, GBS 2048, sequence 4096, no MTP,
moe_act and mlp recomputed, HybridEP on 32 SMs, force-balanced, bf16 Adam moments, the
distributed optimizer with both overlaps, partial CUDA graphs (not priced). Published in
TFLOP/s only, so compared in TFLOP/s. Its ep 32 groups each in one NVLink domain: the guide
has every 32 GPUs (8 nodes) scheduled to one rack (Slurm's --segment 8)."""
GB200_DEEPSEEK_OVERLAPS = ["--use-distributed-optimizer", "--overlap-grad-reduce",
                           "--overlap-param-gather"]


MEASURED = Path(__file__).parent / "measured" / "h200-2026-12-04"
"""Kernel rates `gpu_checks.sh job` measured on one H200 (the H100 SXM's die), each at one
model's own matmul shapes and attention (bench_job.py)."""


def measured_rates(name: str) -> dict[str, Any]:
    """The matmul and attention rates measured at the shapes of `name` (a file in
    MEASURED); the rest of the device stays the preset's."""
    hardware = tomllib.loads((MEASURED / f"{name}.toml").read_text())["hardware"]
    return {k: v for k, v in hardware.items() if k in MEASURED_KEYS}


def with_step(shape: str, gpus: int, overlaps: list[str]) -> list[str]:
    """--overlap-param-gather-with-optimizer-step where Bridge's performance scripts set
    it: dp > 1, pp > 1 and vpp > 1, its parameter gather overlapped."""
    words = shape.split()
    sizes = {k: int(words[words.index(k) + 1]) if k in words else 1
             for k in ("--tp", "--pp", "--cp", "--vpp")}
    dp = gpus // (sizes["--tp"] * sizes["--pp"] * sizes["--cp"])
    on = dp > 1 and sizes["--pp"] > 1 and sizes["--vpp"] > 1 \
        and "--overlap-param-gather" in overlaps
    return ["--overlap-param-gather-with-optimizer-step"] * on


def price(run: BridgeRun, fp8: bool, overlaps: list[str] = OVERLAPS,
          rates: dict[str, Any] | None = None, precision: list[str] | None = None) -> Priced:
    """`run` priced by ppsim: FP8-CS where `fp8`, or with the `precision` flags given."""
    precision = precision if precision is not None else FP8 if fp8 else []
    with tempfile.TemporaryDirectory() as tmp:
        setup = ["--preset", run.preset, *hardware_args(run, tmp)]
        if rates:  # the presets, the device's with these rates, from a config file
            path = Path(tmp) / "measured.toml"
            lines = [f"preset = {json.dumps(run.hardware)}",
                     *(f"{k} = {json.dumps(v)}" for k, v in rates.items())]
            path.write_text(f"[model]\npreset = {json.dumps(run.preset)}\n[hardware]\n"
                            + "\n".join(lines) + "\n")
            setup = ["--config", str(path)]
        sim = ppsim_json(["simulate", *setup, "--gpus", str(run.gpus), *run.shape.split(),
                          *overlaps, *with_step(run.shape, run.gpus, overlaps),
                          *precision, "--json"])
    peak = max(r["peak_memory_bytes"] for r in sim["ranks"])
    return Priced(tokens_per_gpu=sim["throughput"]["tokens_per_s_per_gpu"],
                  tflops_per_gpu=sim["throughput"]["tflops_per_gpu"], peak_gb=peak / 1e9)


def held_out_line(label: str, run: BridgeRun, p: Priced) -> str:
    """One published run beside ppsim's price of it, in a line (in TFLOP/s where only
    those were published)."""
    if not run.tokens_per_gpu:
        return (f"{label} (held out): {run.name} on {run.gpus:,}: published "
                f"{run.tflops_per_gpu:,.0f}, ppsim {p.tflops_per_gpu:,.0f} TFLOP/s/GPU "
                f"({p.tflops_per_gpu / run.tflops_per_gpu - 1:+.1%}), {p.tokens_per_gpu:,.0f} "
                f"tokens/s/GPU, peak {p.peak_gb:.1f} GB")
    line = (f"{label} (held out): {run.name} on {run.gpus:,}: published "
            f"{run.tokens_per_gpu:,.0f}, ppsim {p.tokens_per_gpu:,.0f} tokens/s/GPU "
            f"({p.tokens_per_gpu / run.tokens_per_gpu - 1:+.1%}), {p.tflops_per_gpu:.0f} "
            f"TFLOP/s/GPU, peak {p.peak_gb:.1f} GB")
    if run.tflops_per_gpu:
        line += (f"; GFLOP a token: published {run.tflops_per_gpu / run.tokens_per_gpu * 1e3:.2f}"
                 f", ppsim {p.tflops_per_gpu / p.tokens_per_gpu * 1e3:.2f}")
    return line


def recipe_split_plan(run: BridgeRun, overlaps: list[str], precision: list[str],
                      vpp: int = 1) -> None:
    """`ppsim plan` of `run`'s own shape (its data-parallel size, not --gpus: the split is
    planned, the shape kept; `vpp`: the chunks a rank its layout gives), its recipe's
    layout compared: the best split and the gain."""
    words = run.shape.split()
    layout = words[words.index("--pipeline-model-parallel-layout") + 1]
    shape = [w for w in words if w not in ("--pipeline-model-parallel-layout", layout)]
    sizes = {k: int(words[words.index(k) + 1]) for k in ("--tp", "--pp")}
    dp = run.gpus // (sizes["--tp"] * sizes["--pp"])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        doc = ppsim_json(["plan", "--preset", run.preset, *hardware_args(run, tmp), "--dp",
                          str(dp), "--vpp", str(vpp), *shape, *overlaps, *precision,
                          "--compare", layout, "--json"])
    ours = doc["compared"][0]
    print(f"plan of {run.name} on {run.gpus} {run.hardware} at its recipe's shape "
          f"({time.perf_counter() - t0:.1f} s): best {doc['best']['megatron_layout']} "
          f"{doc['best']['iteration_time_ms']:,.0f} ms, bubble "
          f"{doc['best']['bubble_fraction']:.1%}; the recipe's {layout} "
          f"{ours['iteration_time_ms']:,.0f} ms, bubble {ours['bubble_fraction']:.1%}: the "
          f"best {ours['best_speedup']:.3f}x; proven optimal: {doc['proven_optimal']}"
          + ("" if doc["proven_optimal"] else
             f" (within {doc['best']['gap_to_lower_bound']:.1%} of the lower bound)"))


def nvfp4_against_mxfp8() -> None:
    """NVFP4_PAIRS: each precision against its published run, and NVFP4's speed-up."""
    print("Megatron-Bridge 26.04.01, DGX-GB200, MXFP8 and NVFP4 (held out); gb200-186gb "
          "preset")
    print(f"{'run':16} {'GPUs':>5} {'MXFP8':>7} {'ppsim':>7} {'error':>7} {'NVFP4':>7} "
          f"{'ppsim':>7} {'error':>7} {'peak GB':>7} {'NVFP4/MXFP8':>11} {'ppsim':>6}")
    for pair in NVFP4_PAIRS:
        run = pair.run
        mx = price(run, True, [*OVERLAPS, *BF16_GRADS], precision=MXFP8)
        nv = price(run, True, [*pair.nvfp4_overlaps, *BF16_GRADS], precision=NVFP4)
        mx_error = mx.tokens_per_gpu / pair.mxfp8_tokens_per_gpu - 1
        print(f"{run.name:16} {run.gpus:5} {pair.mxfp8_tokens_per_gpu:7,.0f} "
              f"{mx.tokens_per_gpu:7,.0f} {mx_error:+7.1%} "
              f"{run.tokens_per_gpu:7,.0f} {nv.tokens_per_gpu:7,.0f} "
              f"{nv.tokens_per_gpu / run.tokens_per_gpu - 1:+7.1%} {nv.peak_gb:7.1f} "
              f"{run.tokens_per_gpu / pair.mxfp8_tokens_per_gpu:11.2f} "
              f"{nv.tokens_per_gpu / mx.tokens_per_gpu:6.2f}")


def main() -> None:
    print("Megatron-Bridge 25.11, DGX-H100, FP8-CS (held out); h100-80gb preset")
    print(f"{'run':16} {'GPUs':>5} {'published':>9} {'ppsim FP8':>9} {'error':>7} "
          f"{'TFLOP/s':>7} {'peak GB':>7}   {'ppsim bf16':>10} {'FP8 / bf16':>10}")
    for run in RUNS:
        f8, bf = price(run, True), price(run, False)
        print(f"{run.name:16} {run.gpus:5} {run.tokens_per_gpu:9,.0f} {f8.tokens_per_gpu:9,.0f} "
              f"{f8.tokens_per_gpu / run.tokens_per_gpu - 1:+7.1%} {f8.tflops_per_gpu:7.0f} "
              f"{f8.peak_gb:7.1f}   {bf.tokens_per_gpu:10,.0f} "
              f"{f8.tokens_per_gpu / bf.tokens_per_gpu:10.2f}")
    for system, runs in (("DGX-B200", B200_RUNS), ("DGX-GB200", GB200_RUNS)):
        print(f"Megatron-Bridge 25.11, {system}, FP8-CS (held out); {runs[0].hardware} preset")
        for run in runs:
            f8 = price(run, True, DP_OVERLAPS)
            print(f"{run.name:16} {run.gpus:5} {run.tokens_per_gpu:9,.0f} "
                  f"{f8.tokens_per_gpu:9,.0f} {f8.tokens_per_gpu / run.tokens_per_gpu - 1:+7.1%} "
                  f"{f8.tflops_per_gpu:7.0f} {f8.peak_gb:7.1f}")
    nvfp4_against_mxfp8()
    for label, run, fp8, overlaps in (("26.02, DGX-H100, BF16", BF16_RUN, False, []),
                                      ("25.09, DGX-H100, FP8-CS", DEEPSEEK_RUN, True,
                                       DP_OVERLAPS),
                                      ("26.02.01, DGX-H100, FP8", SMALL_MOE_RUN, True,
                                       DP_OVERLAPS),
                                      ("26.06, DGX-H100, FP8-CS", NANO_RUN, True,
                                       DP_OVERLAPS)):
        print(held_out_line(f"Megatron-Bridge {label}", run, price(run, fp8, overlaps)))
        if run is BF16_RUN:  # the kernel TE falls back to where no fused one takes sinks
            unfused = price(replace(run, shape=f"{run.shape} --attention-backend unfused"),
                            fp8, overlaps)
            print(f"  the same with the unfused attention core: ppsim "
                  f"{unfused.tokens_per_gpu:,.0f} tokens/s/GPU "
                  f"({unfused.tokens_per_gpu / run.tokens_per_gpu - 1:+.1%}), peak "
                  f"{unfused.peak_gb:.1f} GB")
            for shapes in ("qwen3-235b", "weak-1.7B"):
                m = price(run, fp8, overlaps, measured_rates(shapes))
                print(f"  with the matmul and attention rates measured at {shapes}'s "
                      f"shapes: ppsim {m.tokens_per_gpu:,.0f} tokens/s/GPU "
                      f"({m.tokens_per_gpu / run.tokens_per_gpu - 1:+.1%})")
    print(held_out_line("Megatron-Bridge 25.11, DGX-B200, FP8-MX", B200_DEEPSEEK_RUN,
                        price(B200_DEEPSEEK_RUN, True, [*DP_OVERLAPS, *BF16_GRADS],
                              precision=MXFP8)))
    print(held_out_line("Megatron-LM's GB200 guide, DGX-GB200, MXFP8", GB200_DEEPSEEK_RUN,
                        price(GB200_DEEPSEEK_RUN, True, GB200_DEEPSEEK_OVERLAPS,
                              precision=MXFP8)))
    print(held_out_line("DGX Cloud Benchmarking 25.08.01, DGX-H100, FP8-CS",
                        HYBRID_DENSE_RUN, price(HYBRID_DENSE_RUN, True, HYBRID_DENSE_OVERLAPS)))
    if "--quick" in sys.argv:
        return
    recipe_split_plan(B200_DEEPSEEK_RUN, [*DP_OVERLAPS, *BF16_GRADS], MXFP8)
    recipe_split_plan(GB200_DEEPSEEK_RUN, GB200_DEEPSEEK_OVERLAPS, MXFP8, vpp=4)
    plan_case("llama3.1-405b on 8,192 H100, FP8", [
        "--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--gpus", "8192",
        "--global-batch-size", "2048", *OVERLAPS, *FP8])


if __name__ == "__main__":
    main()
