"""FP8 training as Megatron runs it with Transformer Engine on Hopper (--fp8-format).

Inside the decoder layers every weight matmul but the router's is a TE linear (QKV and
MLA's projections, the output projection, the MLPs' fc1 and fc2, routed and shared
experts, the latent projections, a hybrid stack's Mamba and GatedDeltaNet in_proj and
out_proj; an MTP depth's eh_proj, mtp_precision): its forward, input-gradient and
weight-gradient GEMMs run in FP8 at the device's FP8 peak ([hardware] fp8_peak_tflops) on the same
efficiency curve as bf16. The attention core, the router, the embedding and the output
layer stay in bf16 (Megatron's output layer is not a TE module). Each FP8 GEMM's
operands are quantized first: the input in the forward, the output's gradient in the
backward, each read in bf16 and written as FP8 and as its FP8 transpose (Hopper's FP8
GEMMs take one layout; the transpose feeds the weight gradient): ppsim.costs.ops.

Memory: each of those linears saves its input for the backward in FP8 (1 byte an
element, not 2; a mixer's in ppsim.costs.mixers), so attention's output is kept twice,
in bf16 by FlashAttention and in FP8 by the output projection. TE keeps each FP8 weight
and its transpose from the first microbatch to the last (2 bytes a parameter); with
--fp8-param-gather the weight itself is FP8 (1 byte for the bf16 copy's 2) beside its
transpose, and the distributed optimizer gathers it in FP8. Sequence parallelism's
all-gathers of the linears' inputs (the forward's, and the backward's second one for
the weight gradient) move the quantized input. --first-last-layers-bf16 keeps the first
and last decoder layers wholly in bf16 (their weights too). The FLOP count, and so
TFLOP/s and MFU against the bf16 peak, are Megatron's and torchtitan's as without FP8.

Under Megatron-FSDP FP8 is Transformer Engine's as above: with bf16 weights TE caches
each FP8 weight and its transpose from the first microbatch (is_first_microbatch) though
the bf16 weight is gathered and freed around it; with --fp8-param-gather the weights are
FP8 in their shards, gathered in FP8 (one byte a parameter), and each backward makes the
gathered weight's transpose again (read and written, a byte each; Megatron-FSDP drops
the transpose after each use unless keep_fp8_transpose_cache, whose launch flag Megatron
does not have), the unit's transpose beside its buffers.

Under torchtitan's FSDP FP8 is torchao's Float8Linear on every decoder linear (the output
layer filtered out), its three GEMMs priced as TE's. It caches no FP8 weight: the
tensorwise recipe casts the weight each forward and saves that FP8 transpose for the
backward, a microbatch's own (with enable_fsdp_float8_all_gather, --fp8-param-gather
here, FSDP gathers the weight in FP8 and the saved transpose is a view of it); the
rowwise recipe saves the bf16 input and weight and quantizes them again in the backward,
and communicates in bf16 (Architecture.fp8_copies).

NVFP4 (Megatron --fp4-format e2m1, Transformer Engine's NVFP4BlockScaling on Blackwell;
[model] fp8 = "e2m1", fp8_recipe = "nvfp4") quantizes the same linears: their three
GEMMs run at the device's FP4 peak ([hardware] fp4_peak_tflops), each operand quantized
rowwise and columnwise (ppsim.costs.ops.NVFP4_QUANTIZE_BYTES); an element takes 4 bits
and its share of its 16-element block's E4M3 scale, kept, cached (the weight and its
transpose) and, with --fp4-param-gather, gathered. It is priced over Megatron's
distributed optimizer or DDP, not under FSDP. An MTP depth enters no FP4 autocast: its
eh_proj and a GPT model's depth's layer stay bf16, a hybrid model's depth's layers do not
(mtp_layers_fp8).
"""

from __future__ import annotations

from dataclasses import replace

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.ops import NVFP4_BYTES, Op
from ppsim.costs.state import optimizer_shards

FP8_BYTES = 1
"""An FP8 element."""
MX_BLOCK = 32
"""Elements sharing one 1-byte (E8M0) scale under --fp8-recipe mxfp8 (the OCP MX format
Blackwell's tensor cores run; Megatron's get_fp8_align_size: 32)."""


def fp8_bytes(a: Architecture) -> float:
    """Bytes a quantized element takes kept or sent: an FP8 one, and under MXFP8 its share
    of its block's scale; under NVFP4 half a byte and its block's scale."""
    if a.nvfp4:
        return NVFP4_BYTES
    return FP8_BYTES * (1 + 1 / MX_BLOCK) if a.fp8_recipe == "mxfp8" else FP8_BYTES


BF16_MATMULS = ("router",)
"""Weight matmuls of a decoder layer that are not TE linears."""
FP8_INPUTS = ("norm1.out", "q_norm.out", "kv_norm.out", "q_up.in", "kv_up.in", "norm2.out",
              "mlp.act_out",
              "experts.fc1_in", "experts.act_out", "shared.act_out", "latent.fc2_in")
"""Saved tensors (ppsim.costs.modules) that are only an FP8 linear's input."""
PROJ_INPUT = "attn_proj.in"
"""The output projection's FP8 copy of attention's output."""
CACHED_COPIES = 2
"""Bytes a parameter of TE's cached FP8 weight and its transpose."""


def fp8_layers(a: Architecture) -> tuple[bool, ...]:
    """Whether each decoder layer runs FP8: all under --fp8-format but, with
    --first-last-layers-bf16, the first and last ones Megatron keeps in bf16 (by their
    global index: is_first_last_bf16_layer in megatron/core/fp8_utils.py)."""
    return tuple(bool(a.fp8) and not _bf16_index(a, i) for i in range(a.num_layers))


def _bf16_index(a: Architecture, i: int) -> bool:
    """Layer index i is one --first-last-layers-bf16 keeps in bf16 (get_fp8_context's
    and get_fp4_context's test, against num_layers)."""
    start, end = a.num_layers_at_start_in_bf16, a.num_layers_at_end_in_bf16
    return a.first_last_layers_bf16 and (i < start or i >= a.num_layers - end)


def layer_precision(a: Architecture, fp8: bool) -> Architecture:
    """The architecture one decoder layer is priced with: without FP8 for a bf16 layer."""
    return a if fp8 or not a.fp8 else replace(a, fp8="", fp8_param_gather=False)


def mtp_precision(a: Architecture) -> Architecture:
    """The architecture an MTP depth's own ops (eh_proj) are priced with: Megatron runs
    them under its global FP8 autocast (get_fp8_context without a layer index, so FP8 also
    beside --first-last-layers-bf16), where eh_proj is a TE linear like the layers', and
    under no FP4 one (MultiTokenPredictionLayer._proj_and_transformer_layer enters only
    FP8 contexts: bf16)."""
    return layer_precision(a, not a.nvfp4)


def mtp_layers_fp8(a: Architecture, count: int) -> tuple[bool, ...]:
    """Whether each of an MTP depth's `count` decoder layers runs quantized. Under FP8
    all: the depth's global FP8 autocast encloses them. Under NVFP4 the depth enters no
    FP4 context, so a GPT model's layer runs bf16; a hybrid model's HybridStack enters
    get_fp4_context for each of its layers by its index in the MTP pattern (from 0:
    pp_layer_offset=0), so NVFP4 but where --first-last-layers-bf16 takes that index."""
    if not a.fp8 or not a.nvfp4:
        return (bool(a.fp8),) * count
    return tuple(bool(a.hybrid_layer_pattern) and not _bf16_index(a, i) for i in range(count))


def fp8_ops(a: Architecture, ops: list[Op]) -> list[Op]:
    """A decoder layer's ops with its TE linears marked FP8 (unchanged without FP8)."""
    if not a.fp8:
        return ops
    fp4 = a.nvfp4
    return [replace(op, fp8=True, fp4=fp4) if op.params and op.name not in BF16_MATMULS
            else op for op in ops]


def fp8_weight_bytes(a: Architecture, ops: list[Op]) -> int:
    """Bytes one rank holds beyond the bf16 weights for the FP8 linears among `ops`:
    TE's cached FP8 weight and transpose, or, with --fp8-param-gather, what the quantized
    weight and its transpose take beyond the bf16 weight's 2 bytes (FP8's nothing, MXFP8's
    scales, NVFP4's less than nothing), and
    under Megatron-FSDP less: its shards keep the FP8 weight (a byte a parameter for
    bf16's 2; the gradient stays bf16, the master fp32); torchao caches none."""
    if not a.fp8 or a.torchtitan_fsdp:
        return 0
    quantized = sum(op.params for op in ops if op.fp8)
    if not a.fp8_param_gather:
        return int(CACHED_COPIES * fp8_bytes(a) * quantized)
    if not a.megatron_fsdp:  # the quantized weight and its transpose for the bf16 weight
        return int((CACHED_COPIES * fp8_bytes(a) - DTYPE_BYTES[a.dtype]) * quantized)
    saved = DTYPE_BYTES[a.dtype] - fp8_bytes(a)
    return -int(sum(saved * op.params / optimizer_shards(a, op.name.startswith("experts."))
                    for op in ops if op.fp8))


def saved_weight_bytes(a: Architecture, ops: list[Op]) -> int:
    """Bytes a microbatch's forward saves for its backward beyond the activations: the
    FP8 transpose of each weight torchao's tensorwise Float8Linear casts (nothing where
    FSDP gathered the weight in FP8, a view of it, nor for TE's cached copies)."""
    if not (a.torchtitan_fsdp and a.fp8_copies) or a.fp8_param_gather:
        return 0
    return int(fp8_bytes(a) * sum(op.params for op in ops if op.fp8))


def transposed_weight_bytes(a: Architecture, ops: list[Op]) -> float:
    """Bytes a backward moves making the FP8 weights' transposes again: under
    Megatron-FSDP with --fp8-param-gather each gathered FP8 weight among `ops` is read
    and its transpose written (fp8_create_transpose_cache after the backward's gather);
    0 elsewhere (TE's cache, or torchao's saved transpose, made in the forward)."""
    if not (a.fp8 and a.fp8_param_gather and a.megatron_fsdp):
        return 0.0
    return 2 * fp8_bytes(a) * sum(op.params for op in ops if op.fp8)


def gathered_weight_bytes(a: Architecture, bf16_bytes: int) -> float:
    """Bytes a parameter of the decoder layers the distributed optimizer all-gathers."""
    return fp8_bytes(a) if a.fp8 and a.fp8_param_gather else bf16_bytes
