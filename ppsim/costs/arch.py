"""A decoder-only transformer's description (its fields follow Megatron's arguments; the
values each takes: ppsim.costs.choices; its layers' kinds: ppsim.costs.stack; its
attention widths: ppsim.costs.attention_shape; what its MoE fields imply:
ppsim.costs.experts)."""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs.choices import FP4_FORMAT
from ppsim.costs.experts import ExpertShape

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True, kw_only=True)
class Architecture(ExpertShape):
    num_layers: int
    """Decoder layers (Megatron's --num-layers; MTP layers not included)."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads (grouped-query attention); equal to num_heads for MHA."""
    ffn_hidden_size: int
    """MLP width of dense layers."""
    vocab_size: int
    seq_length: int
    vocab_divisor: int = 128
    """The vocabulary is padded to a multiple of this x tp (Megatron
    --make-vocab-size-divisible-by)."""
    pad_vocab: bool = True
    """False: vocab_size is the model's own, taken as it is (Megatron's
    --padded-vocab-size); it must divide by tp (layerops.vocab_split_problem)."""
    micro_batch_size: int = 1
    """Sequences per microbatch."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with three matrices (Llama); False for GPT's two."""
    gated_activation: str = "swiglu"
    """A gated MLP's activation: "swiglu" (Megatron --swiglu, SiLU) or "quick_geglu"
    (--quick-geglu, gpt-oss's): the same matmuls, but Megatron's FLOP count takes a
    gated MLP's third matrix only with --swiglu."""
    linear_bias: bool = False
    """The linears add biases (Megatron's add_bias_linear, its default unless
    --disable-bias-linear): not priced (a vector a matmul); Megatron builds them in no
    shared expert and in routed experts only at etp 1 (ppsim.costs.experts)."""
    dtype: str = "bf16"
    """Training dtype: bf16, fp16 or fp32."""
    fp32_residual: bool = False
    """Keep the residual stream between the sublayers in fp32 (Megatron
    --fp32-residual-connection, with bf16 or fp16): the residual adds write it, the norms
    read it and keep it, the pipeline sends it at 4 bytes an element."""
    tp: int = 1
    """Tensor-parallel size."""
    sequence_parallel: bool = True
    """At tp > 1, split the hidden-wide activations between the tensor-parallel blocks
    (norms, residuals, dropout, a block's input) by tokens over tp, gathering before each
    block and reduce-scattering after (Megatron --sequence-parallel, torchtitan's
    SequenceParallel); False: every tensor rank holds and computes them whole, and each
    block's output is all-reduced (Megatron without the flag)."""
    recompute: str = "none"
    """"none", "selective" (attention core) or "full" (keep only layer inputs)."""
    distributed_optimizer: bool = False
    """Shard optimizer states over dp (Megatron --use-distributed-optimizer)."""
    dp: int = 1
    """Data-parallel size the distributed optimizer shards over."""
    dp_replicas: int = 1
    """Copies of the sharded state across dp x cp: each shards over dp x cp /
    dp_replicas ranks, gradients reduce-scattered inside a copy, then all-reduced across
    the copies (Megatron --num-distributed-optimizer-instances; with fsdp, torchtitan's
    data_parallel_replicate_degree: HSDP)."""
    gradient_accumulation_fusion: bool = True
    """Megatron's default: each weight gradient GEMM accumulates straight into the main
    grad (Transformer Engine's fused wgrad); False (--no-gradient-accumulation-fusion), it
    writes the gradient in the model's dtype and Megatron adds it in after
    (ppsim.costs.state.landed)."""
    bias_swiglu_fusion: bool = True
    """A gated MLP's activation as Megatron's fused SwiGLU (its default): only its input
    kept; False (--no-bias-swiglu-fusion), the eager one that keeps its SiLU output too."""
    fsdp: bool = False
    """Fully shard weights, gradients and Adam's state over dp x cp, one unit a layer:
    torch's FSDP2 as torchtitan applies it (its default data parallelism, ZeRO-3;
    ppsim.job.fsdp)."""
    fsdp_framework: str = "torchtitan"
    """Who shards: "torchtitan" (FSDP2: fp32 shards, bf16 gathers, an fp32 reduce),
    "megatron" (--use-torch-fsdp2: the model in the training dtype, so its gradients
    reduce in it, Megatron's optimizer keeping fp32 masters; pp and ep 1), or
    "megatron-fsdp" (--use-megatron-fsdp, its optim_grads_params strategy: each decoder
    layer a unit gathered and reduce-scattered every microbatch, the embedding and the
    output layer gathered once a step; gradients in the training dtype, fp32 masters;
    ppsim.job.fsdp)."""
    fsdp_cpu_offload: bool = False
    """torchtitan's training.enable_cpu_offload: FSDP2's CPUOffloadPolicy keeps the fp32
    shards, their gradients and Adam's state in pinned host memory, copies a unit's shard
    in before each gather and its reduced gradient out after each reduce-scatter, and
    steps Adam on the host (ppsim.job.host_optimizer)."""
    fsdp_reshard_after_forward: str = "default"
    """torchtitan's policy: "always" frees a unit's gathered weights after its forward
    (gathered again for the backward), "never" keeps them to the backward, "default"
    is always without pipeline parallelism and never with it."""
    grad_reduce_in_bf16: bool = False
    """bf16 training keeps and reduces its gradients in bf16, not fp32 (Megatron
    --grad-reduce-in-bf16): 2 bytes a parameter less, half the data-parallel traffic."""
    grads_in_fp32: bool = False
    """fp16 training keeps and reduces its gradients in fp32, not fp16 (Megatron
    --accumulate-allreduce-grads-in-fp32, which bf16 training sets itself)."""
    optimizer: str = "adam"
    """"adam", or "muon" (Megatron --optimizer muon, ppsim.costs.muon): the decoder's
    2-D weights keep one fp32 momentum instead of Adam's two moments and are stepped by
    Newton-Schulz iterations; the embedding, output layer and norms stay on Adam."""
    muon_ns_steps: int = 5
    """Newton-Schulz iterations a Muon step runs (--muon-num-ns-steps)."""
    muon_tp_mode: str = "duplicated"
    """How Muon orthogonalizes a tensor-parallel weight (--muon-tp-mode): "duplicated",
    the whole matrix on every tensor rank; "blockwise", each shard alone; "distributed",
    the whole matrix's work split over the tensor ranks."""
    precision_aware_optimizer: bool = False
    """TransformerEngine's FusedAdam keeps the optimizer's state in the dtypes below
    (Megatron --use-precision-aware-optimizer; bf16 training, distributed optimizer)."""
    main_grads_dtype: str = "fp32"
    """Gradients the optimizer reads (--main-grads-dtype fp32|bf16): bf16 keeps and
    reduces them in bf16, as --grad-reduce-in-bf16."""
    main_params_dtype: str = "fp32"
    """Master weights (--main-params-dtype fp32|fp16): 2 bytes either way, fp32 ones
    stored as the 16 bits the bf16 weight lacks (TE's store_param_remainders)."""
    exp_avg_dtype: str = "fp32"
    """Adam's first moment (--exp-avg-dtype fp32|fp16|bf16|fp8)."""
    exp_avg_sq_dtype: str = "fp32"
    """Adam's second moment (--exp-avg-sq-dtype fp32|fp16|bf16|fp8)."""
    optimizer_cpu_offload: bool = False
    """Adam on the host for `optimizer_offload_fraction` of the rank's shard (Megatron
    --optimizer-cpu-offload, its HybridDeviceOptimizer; needs the precision-aware
    optimizer): that state in host memory, the gradients copied out and the weights back
    over the host link, the step on the host's cores (ppsim.job.host_optimizer). Its state
    is fp32 on both sides, whatever the dtypes above say."""
    optimizer_offload_fraction: float = 1.0
    """Share of the rank's optimizer shard on the host (--optimizer-offload-fraction)."""
    overlap_cpu_optimizer_d2h_h2d: bool = False
    """Copy, step and copy back tensor by tensor, each stage beside the others (Megatron
    --overlap-cpu-optimizer-d2h-h2d); off, the three run one after the other."""
    optimizer_cpu_threads: int = 1
    """Host threads each rank steps with: the OMP_NUM_THREADS its process runs under,
    which torchrun sets to 1 unless the environment sets it."""
    cp: int = 1
    """Context-parallel size: each rank holds seq_length / cp tokens of every sequence."""
    cp_comm_type: str = "p2p"
    """How attention meets the other ranks' tokens (Megatron --cp-comm-type, Transformer
    Engine's context parallelism): "p2p", K/V passed round a ring behind each chunk's
    attention; "all_gather", K/V gathered before it (and again in the backward, dK/dV
    reduce-scattered after), exposed; "a2a", DeepSpeed-Ulysses: Q, K, V and the output
    exchanged by all-to-all so each rank attends over the whole sequence for 1 / cp of
    the heads, exposed; "a2a+p2p", both: an all-to-all over cp_a2a_size ranks, then
    the ring over the cp / cp_a2a_size groups of them."""
    cp_a2a_size: int = 0
    """Under a2a+p2p, the ranks of each all-to-all: consecutive ranks of the cp group,
    the first of Megatron's --hierarchical-context-parallel-sizes (the ring's the
    second, cp over it); 0: not given."""
    loss_chunks: int = 0
    """torchtitan's ChunkedLossWrapper (num_chunks; every config-registry function's
    loss): the head and loss run chunk by chunk, forward and backward, inside the last
    stage's forward (ppsim.costs.layerops.CHUNK_LOGIT_BYTES); 0: the whole logits at once."""
    tie_embeddings: bool = False
    """The LM head shares the embedding's weights (Megatron's default unless
    --untie-embeddings-and-output-weights): with pp > 1 the first and last stage
    all-reduce that gradient at the end of the step."""
    layers: str = ""
    """Decoder layer kinds in order, e.g. "dense*3, moe*58"; empty: all "moe" when
    num_experts > 0, else all "dense"."""
    mtp_layers: int = 0
    """Multi-token-prediction layers after the decoder (DeepSeek-V3: 1)."""
    head_dim: int = 0
    """Per-head query/key width; 0 means hidden_size / num_heads. For MLA, the
    non-rotary part (qk_nope_head_dim)."""
    attention: str = "gqa"
    """"gqa" (MHA when num_kv_heads = num_heads) or "mla" (DeepSeek's latent attention)."""
    q_lora_rank: int = 0
    """MLA: query compression rank (0: queries projected directly)."""
    kv_lora_rank: int = 0
    """MLA: key/value compression rank."""
    qk_rope_head_dim: int = 0
    """MLA: rotary part of each query/key head."""
    v_head_dim: int = 0
    """MLA: value head width (0: head_dim)."""
    num_experts: int = 0
    """Routed experts per MoE layer."""
    top_k: int = 0
    """Experts each token is routed to."""
    moe_ffn_hidden_size: int = 0
    """Width of each routed expert's MLP."""
    shared_experts: int = 0
    """Experts every token passes through, each moe_ffn_hidden_size wide (DeepSeek-V3: 1):
    the short form of shared_expert_ffn_hidden_size = shared_experts x moe_ffn_hidden_size."""
    shared_expert_ffn_hidden_size: int = 0
    """Width of the one MLP the shared experts make, any width (Megatron
    --moe-shared-expert-intermediate-size; Qwen3-Next: 512); 0: shared_experts x
    moe_ffn_hidden_size. Gated when the MLPs are, split over tp; when set, shared_experts
    is not read."""
    shared_expert_gate: bool = False
    """The shared experts' output times a per-token sigmoid gate (Megatron
    --moe-shared-expert-gate; Qwen3-Next): one weight of hidden_size, whole on every tp
    rank; the output and the gate's score kept for the product's backward."""
    ep: int = 1
    """Expert-parallel size: routed experts are divided over ep ranks."""
    etp: int = 0
    """Expert tensor-parallel size: each routed expert's matmuls are split over etp ranks
    (Megatron --expert-tensor-parallel-size; MoE parallel folding); 0: tp, Megatron's
    default. The experts' world is etp x ep x edp x pp, edp = tp x cp x dp / (etp x ep)."""
    moe_latent_size: int = 0
    """Routed experts work on tokens projected down to this width and back (Megatron
    --moe-latent-size; the projections are whole on every tp rank); 0: the hidden size."""
    moe_capacity_factor: float = 0.0
    """Token-expert pairs an expert takes over its even share (Megatron
    --moe-expert-capacity-factor); beyond it tokens are dropped; 0: dropless."""
    moe_pad_to_capacity: bool = False
    """Each expert computes its whole capacity, padded (--moe-pad-expert-input-to-capacity)."""
    moe_permute_fusion: bool = True
    """The dispatcher's permutation and unpermutation as Transformer Engine's fused kernels
    (Megatron --moe-permute-fusion, which Megatron-Bridge's recipes set); False: Megatron's
    default torch path, whose unpermute weights the pairs and scatter-adds them in passes
    of their own."""
    norm: str = ""
    """"layernorm" or "rmsnorm"; empty: rmsnorm for gated MLPs (Llama), else layernorm."""
    position: str = ""
    """"rotary" or "learned" position embeddings, or "none" (Megatron's Mamba hybrids);
    empty: rotary for gated MLPs."""
    max_position_embeddings: int = 0
    """Rows of a learned position table (Megatron --max-position-embeddings, which
    gpt_builders.py passes as the embedding's max_sequence_length); 0: the sequence."""
    dropout: bool = False
    """Hidden and attention dropout on (GPT-3/Megatron defaults) or off (Llama); each
    dropout keeps a 1-byte mask per element for the backward."""
    hybrid_layer_pattern: str = ""
    """Megatron's --hybrid-layer-pattern: one symbol per layer (M Mamba-2, G GatedDeltaNet,
    * attention, D DeepSeek sparse attention, + MLA, - MLP, E MoE), `|` stage boundaries,
    `/` MTP depths (ppsim.costs.hybrid); it sets num_layers and mtp_layers. Empty: a
    stack of `layers`."""
    mamba_state_dim: int = 128
    """Mamba-2 SSM state size N (Megatron --mamba-state-dim)."""
    mamba_head_dim: int = 64
    """Mamba-2 head width P (--mamba-head-dim)."""
    mamba_num_groups: int = 8
    """Mamba-2 B/C groups (--mamba-num-groups)."""
    mamba_num_heads: int = 0
    """Mamba-2 heads (--mamba-num-heads); 0: 2 x hidden_size / mamba_head_dim."""
    linear_num_key_heads: int = 16
    """GatedDeltaNet query/key heads (--linear-num-key-heads)."""
    linear_num_value_heads: int = 32
    """GatedDeltaNet value/gate heads (--linear-num-value-heads)."""
    linear_key_head_dim: int = 128
    """GatedDeltaNet query/key head width (--linear-key-head-dim)."""
    linear_value_head_dim: int = 128
    """GatedDeltaNet value head width (--linear-value-head-dim)."""
    linear_conv_kernel_dim: int = 4
    """GatedDeltaNet's causal depthwise conv width (--linear-conv-kernel-dim)."""
    dsa_indexer_n_heads: int = 64
    """DeepSeek sparse attention: the lightning indexer's heads (--dsa-indexer-n-heads)."""
    dsa_indexer_head_dim: int = 128
    """DSA indexer head width (--dsa-indexer-head-dim)."""
    dsa_indexer_topk: int = 2048
    """Keys each query attends to under DSA (--dsa-indexer-topk)."""
    attention_window: int = 0
    """Sliding-window attention: each query attends to itself and the attention_window
    keys before it (Megatron --window-size W,0); 0: to every key before it."""
    window_attn_skip_freq: str = ""
    """Which layers the window applies to (Megatron --window-attn-skip-freq): "N", one
    full-attention layer after every N - 1 windowed ones; a list expression of 1
    (windowed) and 0 (full) a layer, e.g. "([1]*3+[0])*9"; empty: every layer."""
    unfused_attention: bool = False
    """The attention core as Megatron's DotProductAttention or Transformer Engine's
    unfused path computes it (--attention-backend local|unfused): K and V repeated to
    every query head, the whole s x s scores by one batched matmul, a fused
    scale-mask-softmax, dropout on the probabilities, a second batched matmul; the
    probabilities kept for the backward (ppsim.costs.layerops.unfused_core_ops)."""
    qk_layernorm: bool = False
    """A norm (`norm`'s kind) on every query and key head before rotary (Megatron
    --qk-layernorm, Transformer Engine's TENorm over head_dim; Qwen3, OLMo 2): two
    memory-bound passes, their inputs and statistics kept; under MLA the norms of the
    query and key/value latents (Megatron's LayerNormLinear up projections), without it
    plain linears."""
    experimental_attention_variant: str = ""
    """Megatron's --experimental-attention-variant: "gdn" (or "gated_delta_net"),
    GatedDeltaNet in the layers linear_attention_freq picks (Qwen3-Next and Qwen3.5 as
    Megatron-Bridge builds them); "dsa", DeepSeek sparse attention over MLA in every layer
    (DeepSeek-V3.2, GLM-5). Each such layer is one layer for the pipeline, its MLP or MoE
    block with it (PAIRED_KINDS); empty: attention."""
    linear_attention_freq: str = ""
    """Under "gdn", which layers are linear (--linear-attention-freq): "N", every Nth layer
    full attention and the others GatedDeltaNet; a list expression of 1 (linear) and 0."""
    attention_output_gate: bool = False
    """Attention's output times the sigmoid of a gate the QKV projection makes as wide as
    the queries (Megatron --attention-output-gate; Qwen3-Next): the gate and the gated
    output kept. Not with MLA, which Megatron refuses it for."""
    fp8: str = ""
    """Transformer Engine's FP8 matmuls in the decoder layers (Megatron --fp8-format
    e4m3|hybrid; ppsim.costs.fp8); empty: bf16."""
    fp8_recipe: str = "delayed"
    """How FP8 scales (--fp8-recipe delayed|tensorwise|blockwise; under FSDP torchao's
    tensorwise|rowwise); the GEMMs priced alike."""
    fp8_param_gather: bool = False
    """Keep the layers' weights in FP8 and gather them so (--fp8-param-gather; under FSDP
    torchtitan's enable_fsdp_float8_all_gather)."""
    first_last_layers_bf16: bool = False
    """Under FP8, keep the first and last decoder layers in bf16 (--first-last-layers-bf16;
    how many: --num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16)."""
    num_layers_at_start_in_bf16: int = 1
    num_layers_at_end_in_bf16: int = 1

    @property
    def residual_bytes(self) -> int:
        """Bytes an element of the residual stream takes (Architecture.fp32_residual)."""
        return 4 if self.fp32_residual else DTYPE_BYTES[self.dtype]

    @property
    def token_ranks(self) -> int:
        """Ranks a hidden-wide activation between the tensor-parallel blocks is split
        over: tp under sequence parallelism, else 1 (every tensor rank holds it whole)."""
        return self.tp if self.sequence_parallel else 1

    @property
    def torchtitan_fsdp(self) -> bool:
        """The replicas shard as torchtitan's FSDP2 (--fsdp)."""
        return self.fsdp and self.fsdp_framework == "torchtitan"

    @property
    def saves_gathered_inputs(self) -> bool:
        """Each column-parallel linear keeps its input gathered over the tensor ranks, whole
        on each, for its weight gradient: torchtitan's tensor parallelism (DTensor's
        matmul saves the redistributed input; ppsim.costs.saved.GATHERED). Megatron's and
        Transformer Engine's keep the rank's own tokens and gather them again in the
        backward (ppsim.job.traffic.regathers)."""
        return self.torchtitan_fsdp and self.tp > 1

    @property
    def megatron_fsdp2(self) -> bool:
        """The replicas shard with Megatron's --use-torch-fsdp2."""
        return self.fsdp and self.fsdp_framework == "megatron"

    @property
    def megatron_fsdp(self) -> bool:
        """The replicas shard with Megatron-FSDP (--use-megatron-fsdp)."""
        return self.fsdp and self.fsdp_framework == "megatron-fsdp"

    @property
    def fsdp_by_megatron(self) -> bool:
        """Megatron shards fully (either of its FSDPs): over its model cast to the
        training dtype, so the gradients are in it too, its optimizer keeping the fp32
        masters; no CPU offload, no torchao FP8."""
        return self.fsdp and self.fsdp_framework != "torchtitan"

    @property
    def rmsnorm(self) -> bool:
        return self.norm == "rmsnorm" or (not self.norm and self.gated_mlp)

    @property
    def rotary(self) -> bool:
        return self.position == "rotary" or (not self.position and self.gated_mlp)

    @property
    def swiglu_keeps_silu(self) -> bool:
        """A gated MLP's activation keeps its SiLU output for the backward: torchtitan's
        eager `silu(w1(x)) * w3(x)` (its FSDP jobs) does, and Megatron's under
        --no-bias-swiglu-fusion; its fused SwiGLU (bias_swiglu_impl, the default, under
        its FSDPs too) keeps only its input and recomputes the SiLU."""
        return self.gated_mlp and (self.torchtitan_fsdp or not self.bias_swiglu_fusion)

    @property
    def fp8_copies(self) -> bool:
        """The FP8 linears save and communicate their quantized operands (Transformer
        Engine; torchao's tensorwise Float8Linear), not the bf16 originals (torchao's
        rowwise, which quantizes them again in the backward and communicates in bf16)."""
        return bool(self.fp8) and not (self.torchtitan_fsdp and self.fp8_recipe == "rowwise")

    @property
    def nvfp4(self) -> bool:
        """The quantized linears run in NVFP4 (--fp4-format), not FP8."""
        return self.fp8 == FP4_FORMAT

    @property
    def quantized_kind(self) -> str:
        """What the job line and the TUI headline call the linears' precision: "NVFP4",
        "FP8", or "" in bf16."""
        return ("NVFP4" if self.nvfp4 else "FP8") if self.fp8 else ""

    @property
    def learned_positions(self) -> bool:
        """A learned position table added to the token embeddings."""
        return self.position != "none" and not self.rotary

    @property
    def position_params(self) -> int:
        """The learned position table's weights: a row of h per position (none else)."""
        rows = max(self.max_position_embeddings, self.seq_length)
        return rows * self.hidden_size if self.learned_positions else 0
