"""The values Megatron's (and torchtitan's) flags take that ppsim prices: each tuple the
choices of one `[model]` field (ppsim.costs.arch.Architecture)."""

RECOMPUTE = ("none", "selective", "full", "op-sac")
"""Megatron's modes (selective: its core-attention recompute) and torchtitan's per-op
SelectiveAC (ppsim.costs.op_sac)."""
LINEAR_VARIANTS = ("gdn", "gated_delta_net")
"""The --experimental-attention-variant values that put GatedDeltaNet in the layers
--linear-attention-freq picks (gated_delta_net is Megatron's deprecated spelling)."""
ATTENTION_VARIANTS = ("", *LINEAR_VARIANTS, "dsa")
"""Megatron's --experimental-attention-variant values ppsim prices."""
ATTENTION = ("gqa", "mla")
NORMS = ("", "layernorm", "rmsnorm")
POSITIONS = ("", "rotary", "learned", "none")
FSDP_RESHARD = ("default", "always", "never")
"""torchtitan's fsdp_reshard_after_forward policies."""
FSDP_FRAMEWORKS = ("torchtitan", "megatron", "megatron-fsdp")
"""Who shards the replicas fully: torchtitan's FSDP2, Megatron's --use-torch-fsdp2, or
Megatron-FSDP (--use-megatron-fsdp)."""
MEGATRON_FSDP_FLAGS = {"megatron": "--use-torch-fsdp2", "megatron-fsdp": "--use-megatron-fsdp"}
"""Megatron's flag of each of its FSDP frameworks."""
MEGATRON_FP8_FORMATS = ("e4m3", "hybrid")
"""Megatron's --fp8-format choices."""
FP4_FORMAT = "e2m1"
"""Megatron's --fp4-format (NVFP4's elements)."""
FP4_RECIPE = "nvfp4"
"""Megatron's --fp4-recipe ppsim prices (Transformer Engine's NVFP4BlockScaling)."""
FP8_FORMATS = ("", *MEGATRON_FP8_FORMATS, FP4_FORMAT)
"""[model] fp8: the format of the decoder layers' quantized linears ("": bf16 matmuls),
FP8's or NVFP4's (ppsim.costs.fp8)."""
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
"""Megatron's --fp8-recipe choices (mxfp8 on Blackwell's tensor cores alone)."""
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
"""Megatron's --cp-comm-type choices."""
GATED_ACTIVATIONS = ("swiglu", "quick_geglu")
"""A gated MLP's activation: Megatron's --swiglu or --quick-geglu."""
OPTIMIZERS = ("adam", "muon")
"""--optimizer values ppsim prices."""
MUON_TP_MODES = ("duplicated", "blockwise", "distributed")
"""--muon-tp-mode values."""
TORCHAO_FP8_RECIPES = ("tensorwise", "rowwise")
"""torchao's Float8Linear recipes torchtitan runs under FSDP (all-tensorwise, rowwise)."""
