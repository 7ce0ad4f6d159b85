"""A model as Megatron's arguments: the inverse of ppsim.cli.megatron_model over nothing
(`ppsim presets NAME` prints it; `plan` prints the parallel sizes and the optimizer's
arguments of a job beside its split)."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields

from ppsim.cli.megatron_moe import bit_runs
from ppsim.costs.arch import Architecture
from ppsim.costs.stack import layer_kinds, mlp_kind
from ppsim.costs.state import OPTIMIZER_DTYPES

RECOMPUTE_FLAGS = {"none": [], "selective": ["--recompute-granularity", "selective"],
                   "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1"]}
"""A global recompute mode as Megatron's flags."""
MAMBA_DEFAULTS = {f.name: f.default for f in dataclass_fields(Architecture)
                  if f.name.startswith(("mamba_", "linear_"))
                  and f.name != "linear_attention_freq"}
"""The mixers' sizes, printed where they differ from Megatron's defaults."""


def megatron_model_args(a: Architecture) -> list[str]:
    """The model as Megatron's arguments, the inverse of `model_table` over nothing: the
    shapes, the kinds of layer, the precision, dropout, the recompute mode, and tp and ep
    (what a launch script's MODEL_ARGS and parallel sizes hold)."""
    kv = _kv
    out = kv("--hybrid-layer-pattern", a.hybrid_layer_pattern) if a.hybrid_layer_pattern \
        else kv("--num-layers", a.num_layers)
    out += kv("--hidden-size", a.hidden_size) + kv("--ffn-hidden-size", a.ffn_hidden_size)
    out += kv("--num-attention-heads", a.num_heads) + _attention_args(a)
    out += kv("--seq-length", a.seq_length) + kv("--max-position-embeddings",
                                                 max(a.max_position_embeddings, a.seq_length))
    out += kv("--vocab-size" if a.pad_vocab else "--padded-vocab-size", a.vocab_size)
    out += activation_args(a)
    out += kv("--make-vocab-size-divisible-by", a.vocab_divisor) * (a.vocab_divisor != 128)
    out += kv("--normalization", "RMSNorm" if a.rmsnorm else "LayerNorm")
    out += kv("--position-embedding-type", "rope" if a.rotary else "learned_absolute"
              if a.learned_positions else "none")
    out += ["--untie-embeddings-and-output-weights"] * (not a.tie_embeddings)
    out += ["--disable-bias-linear"] * (not a.linear_bias)
    out += kv("--attention-backend", "unfused") * a.unfused_attention
    out += {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(a.dtype, [])
    out += ["--fp32-residual-connection"] * a.fp32_residual
    out += precision_args(a)
    out += [] if a.dropout else kv("--attention-dropout", 0) + kv("--hidden-dropout", 0)
    if a.attention_window:
        out += kv("--window-size", f"{a.attention_window},0")
        out += kv("--window-attn-skip-freq", a.window_attn_skip_freq) * bool(
            a.window_attn_skip_freq)
    out += _moe_args(a) + kv("--mtp-num-layers", a.mtp_layers) * bool(
        a.mtp_layers and not a.hybrid_layer_pattern)
    for name, default in MAMBA_DEFAULTS.items():
        if getattr(a, name) != default:
            out += kv("--" + name.replace("_", "-"), getattr(a, name))
    out += kv("--micro-batch-size", a.micro_batch_size) + RECOMPUTE_FLAGS[a.recompute]
    return out + parallel_args(a.tp, a.cp, a.ep, cp_comm_type=a.cp_comm_type,
                               cp_a2a_size=a.cp_a2a_size, etp=a.etp,
                               sequence_parallel=a.sequence_parallel) + optimizer_args(a)


def parallel_args(tp: int, cp: int, ep: int, dispatcher: str = "alltoall",
                  cp_comm_type: str = "p2p", cp_a2a_size: int = 0, etp: int = 0,
                  sequence_parallel: bool = True) -> list[str]:
    """The tensor, context and expert sizes as Megatron's arguments (1s unsaid), with
    what ppsim prices them with: `sequence_parallel` at tp > 1, context parallelism's
    `cp_comm_type` (p2p unsaid; a2a+p2p with its two sizes), the expert tensor-parallel
    size where it is not tp, and the `dispatcher` (all-to-all, or flex: DeepEP, which
    also runs at ep 1 over etp) at ep > 1 (Megatron's default gathers)."""
    out = ["--tensor-model-parallel-size", str(tp)] * (tp > 1)
    out += ["--sequence-parallel"] * (tp > 1 and sequence_parallel)
    out += ["--context-parallel-size", str(cp)] * (cp > 1)
    out += ["--cp-comm-type", cp_comm_type] * (cp > 1 and cp_comm_type != "p2p")
    if cp > 1 and cp_comm_type == "a2a+p2p" and cp_a2a_size:
        out += ["--hierarchical-context-parallel-sizes", str(cp_a2a_size),
                str(cp // cp_a2a_size)]
    out += ["--expert-model-parallel-size", str(ep)] * (ep > 1)
    out += ["--expert-tensor-parallel-size", str(etp)] * bool(etp and etp != tp)
    return out + ["--moe-token-dispatcher-type", dispatcher] * (ep > 1 or dispatcher == "flex")


def activation_args(a: Architecture) -> list[str]:
    """The gated MLP's activation as Megatron's arguments (none: GPT's GeLU MLP)."""
    if not a.gated_mlp:
        return []
    return ["--quick-geglu"] if a.gated_activation == "quick_geglu" \
        else ["--swiglu", *fusion_args(a)]


def precision_args(a: Architecture) -> list[str]:
    """FP8's or NVFP4's arguments and the layers they keep in bf16 (none in bf16)."""
    if not a.fp8:
        return []
    kind = "fp4" if a.nvfp4 else "fp8"
    out = [f"--{kind}-format", a.fp8, f"--{kind}-recipe", a.fp8_recipe]
    out += [f"--{kind}-param-gather"] * a.fp8_param_gather
    if a.first_last_layers_bf16:
        out += ["--first-last-layers-bf16"]
        out += _kv("--num-layers-at-start-in-bf16", a.num_layers_at_start_in_bf16)
        out += _kv("--num-layers-at-end-in-bf16", a.num_layers_at_end_in_bf16)
    return out


def fusion_args(a: Architecture) -> list[str]:
    """The eager SwiGLU and the unfused weight gradients, not Megatron's defaults, as its
    arguments."""
    swiglu = a.gated_mlp and a.gated_activation == "swiglu"
    return ["--no-bias-swiglu-fusion"] * (swiglu and not a.bias_swiglu_fusion) \
        + ["--no-gradient-accumulation-fusion"] * (not a.gradient_accumulation_fusion)


def optimizer_args(a: Architecture) -> list[str]:
    """The optimizer and how the architecture keeps its gradients and the optimizer's
    state, as Megatron's arguments (its defaults unsaid)."""
    out = ["--optimizer", "muon"] if a.optimizer == "muon" else []
    if a.optimizer == "muon":
        out += ["--muon-num-ns-steps", str(a.muon_ns_steps)] * (a.muon_ns_steps != 5)
        out += ["--muon-tp-mode", a.muon_tp_mode] * (a.muon_tp_mode != "duplicated")
    out += ["--use-distributed-optimizer"] * a.distributed_optimizer
    if a.megatron_fsdp:  # Megatron asserts the checkpoint format Megatron-FSDP saves in
        out += ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]
    if a.megatron_fsdp2:
        out.append("--use-torch-fsdp2")
        out += ["--torch-fsdp2-no-reshard-after-forward"] * (
            a.fsdp_reshard_after_forward == "never")
    out += ["--num-distributed-optimizer-instances", str(a.dp_replicas)] * (a.dp_replicas > 1)
    out += ["--grad-reduce-in-bf16"] * a.grad_reduce_in_bf16
    out += ["--accumulate-allreduce-grads-in-fp32"] * a.grads_in_fp32
    if a.precision_aware_optimizer:
        out.append("--use-precision-aware-optimizer")
        out += [tok for key in OPTIMIZER_DTYPES if getattr(a, key) != "fp32"
                for tok in (f"--{key.replace('_', '-')}", getattr(a, key))]
    if a.optimizer_cpu_offload:  # its threads are the environment's OMP_NUM_THREADS
        out += ["--optimizer-cpu-offload", "--optimizer-offload-fraction",
                f"{a.optimizer_offload_fraction:g}"]
        out += ["--overlap-cpu-optimizer-d2h-h2d"] * a.overlap_cpu_optimizer_d2h_h2d
    return out


def _kv(flag: str, value: object) -> list[str]:
    return [flag, str(value)]


def _attention_args(a: Architecture) -> list[str]:
    """The attention's shape, its norms and gate, and an experimental variant."""
    hd = a.head_dim or a.hidden_size // a.num_heads
    if a.attention == "mla":
        out = ["--multi-latent-attention", *_kv("--q-lora-rank", a.q_lora_rank) * bool(
            a.q_lora_rank), *_kv("--kv-lora-rank", a.kv_lora_rank), *_kv("--qk-head-dim", hd),
               *_kv("--qk-pos-emb-head-dim", a.qk_rope_head_dim),
               *_kv("--v-head-dim", a.v_head_dim or hd)]
    else:
        out = (["--group-query-attention", *_kv("--num-query-groups", a.num_kv_heads)]
               * (a.num_kv_heads != a.num_heads))
        out += _kv("--kv-channels", a.head_dim) * bool(a.head_dim)
        out += ["--attention-output-gate"] * a.attention_output_gate
    # MLA's latent norms, which ppsim prices with it or without, are built by this flag.
    out += ["--qk-layernorm"] * a.qk_layernorm
    if a.experimental_attention_variant:
        out += _kv("--experimental-attention-variant", a.experimental_attention_variant)
        out += _kv("--linear-attention-freq", a.linear_attention_freq) * bool(
            a.linear_attention_freq)
    if "dsa" in {k.split("-")[0] for k in layer_kinds(a)}:  # Megatron has no defaults
        out += [*_kv("--dsa-indexer-n-heads", a.dsa_indexer_n_heads),
                *_kv("--dsa-indexer-head-dim", a.dsa_indexer_head_dim),
                *_kv("--dsa-indexer-topk", a.dsa_indexer_topk)]
    return out


def _moe_args(a: Architecture) -> list[str]:
    if not a.num_experts:
        return []
    out = ["--num-experts", str(a.num_experts), "--moe-router-topk", str(a.top_k),
           "--moe-ffn-hidden-size", str(a.moe_ffn_hidden_size)]
    # Megatron refuses top-k 1 under its default softmax without it (megatron_router);
    # where the softmax runs prices the same.
    out += ["--moe-router-pre-softmax"] * (a.top_k == 1)
    if a.shared_width:
        out += ["--moe-shared-expert-intermediate-size",
                str(a.shared_width)]
        out += ["--moe-shared-expert-gate"] * a.shared_expert_gate
    out += ["--moe-permute-fusion"] * a.moe_permute_fusion
    if a.moe_latent_size:
        out += ["--moe-latent-size", str(a.moe_latent_size)]
    if a.moe_capacity_factor:
        out += ["--moe-expert-capacity-factor", f"{a.moe_capacity_factor:g}"]
        out += ["--moe-pad-expert-input-to-capacity"] * a.moe_pad_to_capacity
    kinds = [mlp_kind(k) for k in layer_kinds(a)]  # the MLP kinds alone
    if not a.hybrid_layer_pattern and "dense" in kinds:
        runs = bit_runs([int(k == "moe") for k in kinds])
        out += ["--moe-layer-freq", "(" + "+".join(f"[{bit}]*{n}" for bit, n in runs) + ")"]
    return out
