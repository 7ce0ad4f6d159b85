"""Model and hardware presets (architectures from the models' published configs)."""

from __future__ import annotations

# Architecture fields (see ppsim.transformer.Architecture); tp is a sensible
# default for the model's size and is overridden like any other field. The
# large models default to recompute = "selective", Megatron's default core_attn
# recompute: its activation bytes are Korthikanti's selective-recompute figures
# (FlashAttention stores no s x s scores in any mode).
NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NEMOTRON_H_56B = "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-M-M-M-M-"
"""Megatron-LM examples/post_training/modelopt/conf/nvidia/Nemotron-H-{8B,56B}-Base-8K.sh."""
NEMOTRON_3_NANO = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
"""NVIDIA-NeMo/Megatron-Bridge recipes/nemotronh/h100/nemotron_3_nano.py (its
HybridModelProvider): 23 Mamba-2, 23 MoE, 6 attention layers."""

MODEL_PRESETS: dict[str, dict] = {
    "tiny-gpt": dict(
        num_layers=8, hidden_size=64, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
        vocab_size=2048, seq_length=64, micro_batch_size=2, gated_mlp=False, dtype="fp32"),
    "tiny-llm": dict(
        num_layers=8, hidden_size=64, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
        vocab_size=8192, seq_length=64, micro_batch_size=2, gated_mlp=False, dtype="fp32"),
    "gpt3-1.3b": dict(
        num_layers=24, hidden_size=2048, num_heads=16, num_kv_heads=16, ffn_hidden_size=8192,
        vocab_size=50257, seq_length=2048, micro_batch_size=1, gated_mlp=False,
        tie_embeddings=True, recompute="selective"),
    "llama2-7b": dict(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, ffn_hidden_size=11008,
        vocab_size=32000, seq_length=4096, micro_batch_size=1, recompute="selective"),
    "llama3-8b": dict(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        vocab_size=128256, seq_length=8192, micro_batch_size=1, recompute="selective"),
    "llama3-70b": dict(
        num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, ffn_hidden_size=28672,
        vocab_size=128256, seq_length=8192, micro_batch_size=1, tp=8, recompute="selective"),
    "gpt3-175b": dict(
        num_layers=96, hidden_size=12288, num_heads=96, num_kv_heads=96, ffn_hidden_size=49152,
        vocab_size=50257, seq_length=2048, micro_batch_size=1, gated_mlp=False, tp=8,
        tie_embeddings=True, recompute="selective"),
    "llama3.1-405b": dict(
        num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8, ffn_hidden_size=53248,
        vocab_size=128256, seq_length=8192, micro_batch_size=1, tp=8, recompute="selective",
        distributed_optimizer=True, dp=64),
    "deepseek-v3": dict(
        num_layers=61, layers="dense*3, moe*58", mtp_layers=1, hidden_size=7168,
        num_heads=128, num_kv_heads=128, head_dim=128, attention="mla", q_lora_rank=1536,
        kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, ffn_hidden_size=18432,
        num_experts=256, top_k=8, moe_ffn_hidden_size=2048, shared_experts=1, ep=64,
        vocab_size=129280, seq_length=4096, micro_batch_size=1, recompute="selective",
        distributed_optimizer=True, dp=128, qk_layernorm=True),
    "kimi-k2": dict(
        num_layers=61, layers="dense*1, moe*60", hidden_size=7168, num_heads=64,
        num_kv_heads=64, head_dim=128, attention="mla", q_lora_rank=1536, kv_lora_rank=512,
        qk_rope_head_dim=64, v_head_dim=128, ffn_hidden_size=18432, num_experts=384, top_k=8,
        moe_ffn_hidden_size=2048, shared_experts=1, ep=32, tp=2, etp=1, vocab_size=163840,
        seq_length=4096, micro_batch_size=1, recompute="selective", optimizer="muon",
        distributed_optimizer=True, dp=16, qk_layernorm=True),
    "qwen3-235b-a22b": dict(
        num_layers=94, hidden_size=4096, num_heads=64, num_kv_heads=4, head_dim=128,
        ffn_hidden_size=12288, num_experts=128, top_k=8, moe_ffn_hidden_size=1536, ep=8,
        vocab_size=151936, seq_length=4096, micro_batch_size=1, tp=4, recompute="selective",
        qk_layernorm=True),
    "qwen3-30b-a3b": dict(
        num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128,
        ffn_hidden_size=6144, num_experts=128, top_k=8, moe_ffn_hidden_size=768, ep=8,
        vocab_size=151936, seq_length=4096, micro_batch_size=1, recompute="selective",
        qk_layernorm=True),
    "mixtral-8x7b": dict(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        num_experts=8, top_k=2, moe_ffn_hidden_size=14336, ep=8, vocab_size=32000,
        seq_length=4096, micro_batch_size=1, recompute="selective"),
    "gpt-oss-120b": dict(
        num_layers=36, hidden_size=2880, num_heads=64, num_kv_heads=8, head_dim=64,
        ffn_hidden_size=2880, num_experts=128, top_k=4, moe_ffn_hidden_size=2880, ep=8,
        vocab_size=201088, pad_vocab=False, seq_length=4096, micro_batch_size=1,
        attention_window=127, window_attn_skip_freq="2", gated_activation="quick_geglu",
        recompute="selective"),
    # Hybrid stacks (ppsim.costs.hybrid): the pattern sets num_layers and mtp_layers.
    "tiny-hybrid": dict(
        hybrid_layer_pattern="M-*-G-E-", num_layers=8, hidden_size=64, num_heads=4, num_kv_heads=4,
        ffn_hidden_size=256, vocab_size=2048, seq_length=64, micro_batch_size=2,
        gated_mlp=False, norm="rmsnorm", position="rotary", dtype="fp32", mamba_head_dim=16,
        mamba_num_groups=2, mamba_state_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, top_k=2,
        moe_ffn_hidden_size=64),
    "nemotron-h-8b": dict(
        hybrid_layer_pattern=NEMOTRON_H_8B, num_layers=52, hidden_size=4096, num_heads=32,
        num_kv_heads=8,
        head_dim=128, ffn_hidden_size=21504, gated_mlp=False, norm="rmsnorm",
        position="rotary", mamba_num_heads=128, mamba_head_dim=64, mamba_num_groups=8,
        mamba_state_dim=128, vocab_size=131072, seq_length=8192, micro_batch_size=1,
        recompute="selective"),
    "nemotron-h-56b": dict(
        hybrid_layer_pattern=NEMOTRON_H_56B, num_layers=118, hidden_size=8192, num_heads=64,
        num_kv_heads=8,
        head_dim=128, ffn_hidden_size=32768, gated_mlp=False, norm="rmsnorm",
        position="none", mamba_head_dim=64, mamba_num_groups=8, mamba_state_dim=256,
        vocab_size=131072, seq_length=8192, micro_batch_size=1, tp=8, recompute="selective"),
    "nemotron-3-nano-30b-a3b": dict(
        hybrid_layer_pattern=NEMOTRON_3_NANO, num_layers=52, hidden_size=2688, num_heads=32,
        num_kv_heads=2, head_dim=128, ffn_hidden_size=1856, gated_mlp=False, norm="rmsnorm",
        position="none", mamba_num_heads=64, mamba_head_dim=64, mamba_num_groups=8,
        mamba_state_dim=128, num_experts=128, top_k=6, moe_ffn_hidden_size=1856,
        shared_experts=2, vocab_size=131072, seq_length=8192, micro_batch_size=1, ep=8,
        recompute="selective"),
    "qwen3-next-80b-a3b": dict(
        hybrid_layer_pattern="GEGEGE*E" * 12 + "/*E", num_layers=96, mtp_layers=1,
        hidden_size=2048, num_heads=16,
        num_kv_heads=2, head_dim=256, ffn_hidden_size=5120, num_experts=512, top_k=10,
        moe_ffn_hidden_size=512, shared_experts=1, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        vocab_size=151936, seq_length=4096, micro_batch_size=1, ep=8, recompute="selective",
        qk_layernorm=True, attention_output_gate=True, shared_expert_gate=True),
    "qwen3.5-397b-a17b": dict(
        hybrid_layer_pattern="GEGEGE*E" * 15, num_layers=120, hidden_size=4096, num_heads=32,
        num_kv_heads=2, head_dim=256, ffn_hidden_size=10240, num_experts=512, top_k=10,
        moe_ffn_hidden_size=1024, shared_experts=1, linear_num_key_heads=16,
        linear_num_value_heads=64, linear_key_head_dim=128, linear_value_head_dim=128,
        vocab_size=248320, seq_length=4096, micro_batch_size=1, ep=64, recompute="selective",
        qk_layernorm=True, attention_output_gate=True, shared_expert_gate=True),
}

MODEL_NOTES: dict[str, str] = {
    "tiny-gpt": "CPU-sized GPT the executor trains in seconds",
    "tiny-llm": "tiny-gpt with an LLM's heavy head: vocab 8192 over hidden 64, so the LM "
    "head and loss weigh several layers on a CPU (the default; `ppsim demo` moves layers "
    "off the last rank)",
    "gpt3-1.3b": "GPT-3 XL, the output layer tied to the embedding (arXiv 2005.14165: 1.3B)",
    "llama2-7b": "Llama 2 7B",
    "llama3-8b": "Llama 3 8B (GQA, 128k vocab)",
    "llama3-70b": "Llama 3 70B, tp 8",
    "gpt3-175b": "GPT-3 175B, tp 8, the output layer tied to the embedding (Megatron-LM's "
    "examples/gpt3/train_gpt3_175b_distributed.sh; arXiv 2005.14165: 175B)",
    "llama3.1-405b": "Llama 3.1 405B, tp 8, distributed optimizer over dp 64 "
    "(meta-llama/Llama-3.1-405B "
    "config.json; Llama 3 paper: TP8 PP16 DP64)",
    "deepseek-v3": "DeepSeek-V3: MLA, 3 dense + 58 MoE layers (256 experts top-8 + 1 shared), "
    "1 MTP, ep 64, distributed optimizer over dp 128 (deepseek-ai/DeepSeek-V3 config.json; "
    "arXiv 2412.19437: 671B, 37B active)",
    "kimi-k2": "Kimi K2: MLA (64 heads), 1 dense + 60 MoE layers (384 experts top-8 + 1 "
    "shared), tp 2, ep 32, etp 1, Muon (as Moonshot trained it and Megatron-Bridge's recipe "
    "runs it) under the distributed optimizer over dp 16 (moonshotai/Kimi-K2-Instruct "
    "config.json; Bridge's H100 recipe shape; 1T, 32B active)",
    "qwen3-235b-a22b": "Qwen3-235B-A22B: 94 MoE layers, 128 experts top-8, GQA 64/4 with "
    "query and key norms, tp 4, ep 8 (Qwen/Qwen3-235B-A22B config.json; 235B, 22B active)",
    "qwen3-30b-a3b": "Qwen3-30B-A3B: 48 MoE layers, 128 experts top-8 (768 wide), GQA "
    "32/4 with query and key norms, ep 8 (Qwen/Qwen3-30B-A3B config.json; 30.5B, 3.3B "
    "active)",
    "mixtral-8x7b": "Mixtral 8x7B: 32 MoE layers, 8 experts top-2, ep 8 "
    "(mistralai/Mixtral-8x7B-v0.1 config.json; 46.7B, 12.9B active)",
    "gpt-oss-120b": "gpt-oss-120b: 36 MoE layers, 128 experts top-4, GQA 64/8, a 128-token "
    "sliding window on every other layer, ep 8 (openai/gpt-oss-120b config.json; Megatron-LM's "
    "examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh; arXiv 2508.10925: 116.8B, "
    "5.1B active; its gated MLP is Megatron's --quick-geglu, the same matmuls as --swiglu)",
    "tiny-hybrid": "CPU-sized hybrid stack: Mamba-2, attention, GatedDeltaNet, MoE and MLP "
    "layers (pattern M-*-G-E-)",
    "nemotron-h-8b": "NVIDIA Nemotron-H-8B-Base-8K: 24 Mamba-2, 24 MLP, 4 attention layers "
    "(Megatron-LM's Nemotron-H-8B-Base-8K.sh; arXiv 2504.03624; 8B)",
    "nemotron-h-56b": "NVIDIA Nemotron-H-56B-Base-8K: 54 Mamba-2, 54 MLP, 10 attention "
    "layers, tp 8 (Megatron-LM's Nemotron-H-56B-Base-8K.sh; arXiv 2504.03624; 56B)",
    "nemotron-3-nano-30b-a3b": "NVIDIA Nemotron 3 Nano 30B-A3B: 23 Mamba-2, 23 MoE (128 "
    "experts top-6, squared ReLU; its one shared expert of 3,712 counted as 2 of 1,856), 6 "
    "attention layers, ep 8 (Megatron-Bridge's nemotron_3_nano recipe; NVIDIA's Nemotron 3 "
    "Nano report: 31.6B, 3.2B active)",
    "qwen3-next-80b-a3b": "Qwen3-Next-80B-A3B: 36 GatedDeltaNet + 12 gated attention layers "
    "(an output gate, query and key norms), each with a MoE (512 experts top-10 + 1 "
    "gated shared), 1 MTP, ep 8, as a hybrid pattern (Qwen/Qwen3-Next-80B-A3B config.json; "
    "80B, 3B active); Megatron-Bridge builds it as a GPT model, which splits by decoder "
    "layer: --num-layers 48 --experimental-attention-variant gated_delta_net "
    "--linear-attention-freq 4 --mtp-num-layers 1 after the preset",
    "qwen3.5-397b-a17b": "Qwen3.5-397B-A17B's decoder: 45 GatedDeltaNet (64 value heads) + "
    "15 gated attention layers, each with a MoE (512 experts top-10, 1,024 wide, + 1 gated "
    "shared), vocab 248,320, ep 64: 8 experts a GPU (Megatron-LM's MIMO example, "
    "get_qwen35_language_model_config, which sets no MTP; 397B, 17B active); as Bridge's "
    "GPT model: --num-layers 60 --experimental-attention-variant gated_delta_net "
    "--linear-attention-freq 4 after the preset",
}



def _curve(achieved_tflops: float, fixed_us: float, peak: float = 989.0) -> list[list[float]]:
    """A matmul efficiency curve from two physical figures: the rate a large matmul
    achieves and a fixed time per matmul (launch, fill and drain): a g-GFLOP matmul
    takes fixed_us + g / achieved, so efficiency = top x g / (g + achieved x fixed)."""
    half = achieved_tflops * fixed_us * 1e-3  # GFLOP at which efficiency is half the top
    return [[g, round(achieved_tflops / peak * g / (g + half), 4)]
            for g in (0.25, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0)]


# Peak dense bf16 TFLOP/s; P2P bandwidth in GB/s (10^9 bytes/s) between
# pipeline neighbours on different nodes (one InfiniBand NIC per GPU). The roofline
# figures: large bf16 matmuls reach ~80 % of peak in a burst (790 TFLOP/s on an H200
# at 8192^3; A100 ~250 of 312) with ~5 us fixed per matmul; FlashAttention-2 (what
# scaled_dot_product_attention runs) reaches ~35 % of peak on Hopper, ~55 % on
# A100 (Dao 2023; Shah et al. 2024); memory bandwidth is a copy's achieved rate,
# ~90 % of the HBM spec (H200 4.8 TB/s -> 4.3 measured, H100 3.35, A100 2.04);
# eager PyTorch spends ~10 us of host time per kernel. The H100's top rate is the
# sustained one: a GPU in a training job runs power-saturated near its 700 W TDP, at a
# lower clock than a matmul burst. stas00/ml-engineering measured H200 bf16 (the same
# GH100 die, 989 peak and 700 W as the H100 SXM) at 825-848 TFLOP/s in bursts (MAMF)
# but 700-745 sustained (MSMF), 727 for a node of 8 computing at once
# (compute/accelerator/benchmarks/README.md): 727 with 5 us fixed. The curve's shape
# matches XLA's measured sm_90 bf16 table (xla/service/gpu/model/
# matmul_interpolator_data.h: 632 TFLOP/s at 2048^3, 783 at 4096^3 in bursts, the same
# ratio as 5 us fixed gives). The H200's figures are fitted to
# what ppsim's executor measured on one (issue 11: gpt3-1.3b and llama3-8b layers and
# heads, F/B/W): 40 us fixed per matmul (813 TFLOP/s beyond it: 790 at 8192^3),
# attention at 30 %, 3.0 TB/s for elementwise work, and 80 us of host time per
# modelled op (Python modules, dispatch, autograd; the same figure
# `profile --hardware-out` measures on this 2-core VM's CPU: ~78 us).
#
# FP8 (--fp8-format, ppsim.costs.fp8): the dense FP8 tensor-core peak is twice bf16's,
# 1979 TFLOP/s on H100 and H200 SXM (NVIDIA H100 datasheet); A100 has none. FP8 GEMMs
# run on bf16's efficiency curve scaled by fp8_efficiency_ratio, the share of their peak
# they reach over bf16's at the same size: 0.92, measured on an H200 at the settled clock
# (benchmarks/bench_fp8_gemm.py, torch._scaled_mm with per-tensor scales, 2026-12-04:
# the Llama 3 70B and 405B linears' seven per-rank shapes, FP8 56-64 % of 1979 where
# bf16 reaches 65-70 % of 989, ratios 0.87-0.95, mean 0.915; tile-lang's H800 table,
# benchmark/matmul_fp8, gives 0.95 at 8192^3 in bursts).
#
# Topology (ppsim.job.topology), per GPU and per direction: NVLink 4 on H100/H200 SXM is
# 900 GB/s bidirectional per GPU (NVIDIA H100 datasheet), 450 each way; NVLink 3 on A100
# SXM 600 GB/s (A100 datasheet), 300 each way. A DGX H100/H200 node has 8 ConnectX-7 NICs
# of 400 Gb/s, one per GPU: 50 GB/s (DGX H100 user guide); DGX A100 8 x 200 Gb/s HDR:
# 25 GB/s. One collective step costs ~1 us inside a node and ~5 us across nodes, the
# order of nccl-tests' small-message latencies (a modelling figure, not a datasheet one).
_TOPOLOGY_H = dict(gpus_per_node=8, intra_node_bandwidth_gbps=450.0, intra_node_latency_us=1.0,
                   inter_node_bandwidth_gbps=50.0, inter_node_latency_us=5.0)
_TOPOLOGY_A = dict(gpus_per_node=8, intra_node_bandwidth_gbps=300.0, intra_node_latency_us=1.0,
                   inter_node_bandwidth_gbps=25.0, inter_node_latency_us=5.0)
#
# Host link and host memory (activation offload): H100 and H200 SXM attach to the
# host over PCIe Gen5 x16 (B200 too), A100 SXM over PCIe Gen4 x16 (NVIDIA H100/H200/A100
# datasheets): 32 and 16 GT/s x 16 lanes, 128b/130b coded, 63 and 31.5 GB/s each
# way. DGX H100, DGX H200, DGX B200 and DGX A100 (640 GB) nodes have 2 TB of system memory
# for their 8 GPUs (DGX user guides).
#
# The host's DRAM (the optimizer on the host, --optimizer-cpu-offload): an 8-GPU H100/H200
# node has two Xeon Platinum 8480C of 8 DDR5 channels each, its 2 TB in 32 DIMMs of 64 GB
# (NVIDIA's MLPerf Inference v4.1 system description of an 8 x H200 SXM node), two a
# channel, which Sapphire Rapids clocks at 4400 MT/s (4800 at one a channel: Intel's
# 8480+ specification): 16 x 4400 MT/s x 8 B = 563.2 GB/s. DGX B200's two Xeon Platinum
# 8570 hold its 2 TB the same way (assumed: 4400 MT/s at two a channel). DGX A100's two
# EPYC 7742 have 8 DDR4-3200 channels each: 409.6 GB/s. A GB200's Grace has 480 GB of
# LPDDR5X at 512 GB/s for its two GPUs (NVL72: 18.4 TB/s for 36).
# One host core steps 0.9 billion parameters a second with torch's fused AdamW in fp32
# (benchmarks/bench_host_optimizer.py: 0.85-1.53 across runs on the AVX-512/AMX Xeon
# of docs/benchmarks.md's CPU VM, the low end taken; the EPYC's and Grace's cores are not
# measured).
_HOST = {"pcie5": dict(host_link_gbps=63.0, host_memory_bytes=2e12,
                       host_memory_bandwidth_gbps=563.2, host_core_adam_gparams=0.9),
         "pcie4": dict(host_link_gbps=31.5, host_memory_bytes=2e12,
                       host_memory_bandwidth_gbps=409.6, host_core_adam_gparams=0.9)}
#
# Streaming multiprocessors: 132 on the H100 SXM5 (NVIDIA H100 Tensor Core GPU
# Architecture whitepaper) and on the H200 (the same GH100; torch reports 132 on the
# lent one), 108 on the A100 (NVIDIA A100 whitepaper). A communication kernel that
# holds some of them beside compute (DeepEP's 20) slows that compute by their share.
# NCCL runs a collective as one CTA per channel, each alone on its SM ("NCCL CTAs
# won't share an SM with compute kernels"), and takes as many channels as the
# platform's bandwidth needs: 16 SMs on a DGX with 8 NICs (NCCL's maintainer,
# NVIDIA/nccl issue 689); NCCL's own log of a ring over three 8-GPU, 8-NIC H100 nodes
# lists 16 channels (NVIDIA/nccl issue 1453). A data-parallel collective hidden
# behind compute slows it by 16 / sm_count.
_COLLECTIVE_SMS = dict(collective_sms=16)

# B200 (DGX/HGX B200, Blackwell GB100, sm_100, 1000 W): 2250 TFLOP/s dense bf16 and 4500
# FP8 (NVIDIA HGX B200 datasheet: 36 and 72 PFLOPS for 8 GPUs with sparsity), 180 GB of
# HBM3e at 8 TB/s (DGX B200: 1,440 GB, 64 TB/s), 148 SMs (as B200 software reports),
# NVLink 5 at 1.8 TB/s bidirectional per GPU (900 each way), 8 ConnectX-7 NICs of 400 Gb/s
# (DGX B200 datasheet: 50 GB/s per GPU), PCIe Gen5 x16 to the host, 2 TB of system memory.
# Matmuls: XLA's measured sm_100 bf16 table (matmul_interpolator_data.h) fits a fixed
# 6 us plus 1530 TFLOP/s beyond it (466 TFLOP/s at 2048x1024x1024, 1142-1186 at 34 GFLOP,
# 1338-1544 at 137); those are bursts, and ml-engineering's brute-force best shape reaches
# 1745 (MAMF), so the sustained rate a training job holds is not measured yet. FP8 over
# bf16 at the same share of peak: MAMF 76.3 % of 4500 against 77.6 % of 2250, 0.98.
# Attention: cuDNN 9.13's best forward on B200, 1605 / 1.3 TFLOP/s (the FlashAttention-4
# paper and Together AI's post: FA4 reaches 1605, up to 1.3x cuDNN), 55 % of peak: an upper
# figure, since the backward and short sequences run slower. Memory-bound work at 90 % of
# the HBM rate, as on the H100; NCCL's 16 channels on an 8-NIC node as there (unmeasured
# on B200). NVFP4 (--fp4-format): 9000 TFLOP/s dense FP4 (the HGX B200 datasheet's 144
# PFLOPS for 8 with sparsity), its GEMMs on the bf16 curve (fp4_efficiency_ratio 1: no
# NVFP4 GEMM has been measured for ppsim yet).
_TOPOLOGY_B = dict(_TOPOLOGY_H, intra_node_bandwidth_gbps=900.0)
#
# GB200 NVL72 (a rack of 36 GB200 superchips, each one Grace and two Blackwell GPUs, at
# 1200 W): per GPU 2500 TFLOP/s dense bf16 and 5000 FP8 (NVL72: 360 PFLOPS FP8 for 72),
# 186 GB of HBM3e at 8 TB/s (13.4 TB and 576 TB/s for 72), 152 SMs (as GB200 software
# reports), one NVLink 5 domain of 72 GPUs at 900 GB/s each way, one 400 Gb/s ConnectX-7
# NIC a GPU to the next rack; the host is its Grace over NVLink-C2C, 900 GB/s
# bidirectional shared by its two GPUs (225 each way a GPU), with 480 GB of LPDDR5X
# (17.3 TB for the 72). Matmuls on the same sm_100 curve as the B200 (XLA's table names
# no device; ml-engineering's best shapes put GB200 4 % above B200, 1822 against 1745);
# FP8 at MAMF's 72.3 % against 72.9 %, 0.99; attention at cuDNN's B200 rate, 1235 of 2500.
# NVFP4: 10,000 TFLOP/s dense FP4 (NVL72: 1,440 PFLOPS FP4 with sparsity for 72), on the
# bf16 curve as on the B200.
_TOPOLOGY_NVL72 = dict(_TOPOLOGY_B, gpus_per_node=72)

# memory_bytes: the nameplate capacity in 10^9 bytes; NVML reports ~7 % more (H100
# 81,559 MiB, H200 143,771 MiB, A100 80GB 81,920 MiB), left to what ppsim does not count
# (CUDA context, NCCL and library buffers, allocator fragmentation): docs/model.md, Memory.
HARDWARE_PRESETS: dict[str, dict] = {
    "a100-80gb": dict(memory_bytes=80e9, peak_tflops=312.0, efficiency=0.5,
                      p2p_bandwidth_gbps=25.0, p2p_latency_ms=0.01,
                      matmul_efficiency=_curve(250.0, 5.0, 312.0),
                      attention_efficiency=0.55, memory_bandwidth_gbps=1850.0,
                      kernel_overhead_us=10.0, sm_count=108, **_TOPOLOGY_A,
                      **_COLLECTIVE_SMS,
                      **_HOST["pcie4"]),
    "h100-80gb": dict(memory_bytes=80e9, peak_tflops=989.0, fp8_peak_tflops=1979.0,
                      fp8_efficiency_ratio=0.92, efficiency=0.45,
                      p2p_bandwidth_gbps=50.0, p2p_latency_ms=0.01,
                      matmul_efficiency=_curve(727.0, 5.0), attention_efficiency=0.35,
                      memory_bandwidth_gbps=3000.0, kernel_overhead_us=10.0, sm_count=132,
                      **_TOPOLOGY_H, **_HOST["pcie5"], **_COLLECTIVE_SMS),
    "h200-141gb": dict(memory_bytes=141e9, peak_tflops=989.0, fp8_peak_tflops=1979.0,
                       fp8_efficiency_ratio=0.92, efficiency=0.45,
                       p2p_bandwidth_gbps=50.0, p2p_latency_ms=0.01,
                       matmul_efficiency=_curve(813.0, 40.0), attention_efficiency=0.30,
                       memory_bandwidth_gbps=3000.0, kernel_overhead_us=80.0, sm_count=132,
                       **_TOPOLOGY_H, **_HOST["pcie5"], **_COLLECTIVE_SMS),
    "b200-180gb": dict(memory_bytes=180e9, peak_tflops=2250.0, fp8_peak_tflops=4500.0,
                       fp4_peak_tflops=9000.0, mxfp8=True,
                       fp8_efficiency_ratio=0.98, efficiency=0.45,
                       p2p_bandwidth_gbps=50.0, p2p_latency_ms=0.01,
                       matmul_efficiency=_curve(1530.0, 6.0, 2250.0),
                       attention_efficiency=0.55, memory_bandwidth_gbps=7200.0,
                       kernel_overhead_us=10.0, sm_count=148,
                       **_TOPOLOGY_B, **_HOST["pcie5"], **_COLLECTIVE_SMS),
    "gb200-186gb": dict(memory_bytes=186e9, peak_tflops=2500.0, fp8_peak_tflops=5000.0,
                        fp4_peak_tflops=10000.0, mxfp8=True,
                        fp8_efficiency_ratio=0.99, efficiency=0.45,
                        p2p_bandwidth_gbps=50.0, p2p_latency_ms=0.01,
                        matmul_efficiency=_curve(1530.0, 6.0, 2500.0),
                        attention_efficiency=0.49, memory_bandwidth_gbps=7200.0,
                        kernel_overhead_us=10.0, sm_count=152, host_link_gbps=225.0,
                        host_memory_bytes=72 * 240e9, host_memory_bandwidth_gbps=36 * 512.0,
                        host_core_adam_gparams=0.9, **_TOPOLOGY_NVL72,
                        **_COLLECTIVE_SMS),
    # Peak: one core's fp32 matmul (2048^3, one thread: 191 GFLOP/s on the AVX-512 Xeon
    # of docs/benchmarks.md's CPU VM), MFU's denominator; the analytic rate is 0.04
    # TFLOP/s, what a tiny model's eager ops reach (a profile measures the real ones).
    "cpu": dict(memory_bytes=16e9, peak_tflops=0.19, efficiency=0.04 / 0.19,
                p2p_bandwidth_gbps=1.0, p2p_latency_ms=0.05),
}

HARDWARE_NOTES: dict[str, str] = {
    "a100-80gb": "NVIDIA A100 80 GB, HDR InfiniBand",
    "h100-80gb": "NVIDIA H100 80 GB, NDR InfiniBand",
    "h200-141gb": "NVIDIA H200 141 GB, NDR InfiniBand",
    "b200-180gb": "NVIDIA B200 180 GB (DGX B200), NDR InfiniBand",
    "gb200-186gb": "NVIDIA GB200 NVL72: 72 GPUs of 186 GB in one NVLink domain",
    "cpu": "CPU processes over gloo (calibrate with ppsim profile)",
}
