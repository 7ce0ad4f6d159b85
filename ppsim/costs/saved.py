"""A decoder layer's saved tensors, by name: each tensor autograd keeps for the backward
with its bytes per tp rank, whole layers and a hybrid stack's halves (the same counts as
ppsim.costs.layerops). What a memory policy does to them: ppsim.costs.modules."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.attention_shape import attention_shape
from ppsim.costs.attention_tensors import GATED, qk_norm_and_gate, unfused_tensors
from ppsim.costs.fp8 import FP8_INPUTS, PROJ_INPUT, fp8_bytes
from ppsim.costs.kv_split import held_attention_shape

SHARED_GATE = ("shared.out", "shared.gate_score")
"""What the shared experts' gate keeps: their output and its sigmoid score a token."""


TOKEN_SPLIT = ("norm1.", "norm2.", "q_norm.", "kv_norm.", "q_up.in", "kv_up.in", "drop1.",
               "drop2.", "attn.k_rope", "router.")
"""The saved tensors (by name prefix) that are hidden-wide or a latent between the
tensor-parallel blocks, or the router's per token: split over Architecture.token_ranks,
the rest by width over tp. (A MoE layer's experts' are all over tp: Megatron runs MoE
with tp > 1 only under sequence parallelism.)"""


SHARED_INPUT = "shared.fc1_in"
GATHERED = ("norm1.out", "q_norm.", "kv_norm.", "q_up.in", "kv_up.in", "attn.k_rope",
            SHARED_INPUT)
"""What torchtitan's tensor parallelism keeps whole on every tensor rank: each block
redistributes its input to Replicate (an all-gather under SequenceParallel) and its
column-parallel linears save that gathered input for their weight gradients (DTensor's
matmul; Megatron's and TE's save the rank's tokens and gather again, traffic.regathers);
MLA's down projections, latent norms and rotary key run replicated on it."""
GATHERED_FFN = ("norm2.out", "router.")
"""The same for the feed-forward block: a dense MLP's, and a MoE's without expert
parallelism, whose router and experts take the gathered tokens (with it they take the
rank's own, and only the shared experts gather: SHARED_INPUT)."""


def gathered(a: Architecture, kind: str = "dense") -> tuple[str, ...]:
    """The saved tensors (by name prefix) a tensor rank holds whole (GATHERED)."""
    if not a.saves_gathered_inputs:
        return ()
    return GATHERED + (GATHERED_FFN if kind != "moe" or a.routes_gathered_tokens else ())


def split_over(a: Architecture, name: str, kind: str = "dense") -> int:
    """Ranks a saved tensor of a layer of `kind` is split over."""
    if name.startswith(gathered(a, kind)):
        return 1
    return a.token_ranks if name.startswith(TOKEN_SPLIT) else a.tp


def per_rank(a: Architecture, tensors: dict[str, float], kind: str = "dense"
             ) -> dict[str, float]:
    """Whole tensors' bytes as one tensor rank holds them."""
    return {k: v / split_over(a, k, kind) for k, v in tensors.items()}


LAYER_INPUT = "norm1.in"
"""What a fully recomputed layer keeps: its input (the residual stream)."""

@dataclass(frozen=True)
class HybridHalf:
    """The half of a decoder layer a hybrid stack's layer is."""

    base: str
    """The decoder layer's kind ("dense" or "moe")."""
    prefixes: tuple[str, ...]
    """Its saved tensors' name prefixes (the half's share of the layer's)."""
    modules: tuple[str, ...]
    """The recompute and offload modules it has."""
    input: str = LAYER_INPUT
    """The saved tensor that is its input: its norm's."""


_ATTENTION_HALF = HybridHalf(
    base="dense", prefixes=("norm1.", "attn.", "attn_proj.", "q_norm.", "kv_norm.", "q_up.",
                            "kv_up.", "qk_norm.", "drop1."),
    modules=("core_attn", "layernorm", "mla_up_proj", "attn_norm", "qkv_linear", "attn_proj"))
HYBRID_HALVES: dict[str, HybridHalf] = {
    "attention": _ATTENTION_HALF,
    "mla": _ATTENTION_HALF,
    "dsa": replace(_ATTENTION_HALF, prefixes=(*_ATTENTION_HALF.prefixes, "dsa.")),
    "mlp": HybridHalf(base="dense", prefixes=("norm2.", "mlp.", "drop2."),
                      modules=("mlp", "layernorm", "mlp_norm"), input="norm2.in"),
    "moe-mlp": HybridHalf(
        base="moe", prefixes=("norm2.", "router.", "experts.", "shared.", "latent.", "drop2."),
        modules=("moe", "moe_act", "shared_experts", "expert_fc1", "layernorm", "mlp_norm"),
        input="norm2.in"),
}
"""A hybrid stack's attention, MLP and MoE layers (ppsim.costs.mixers) as the half of a
decoder layer each is (Megatron builds them as TransformerLayers with the other half
empty). Mamba and GatedDeltaNet layers have none."""


def half_arch(a: Architecture, kind: str) -> Architecture:
    """The architecture a hybrid half runs: '+' and 'D' layers are MLA (ppsim.costs.mixers)."""
    return replace(a, attention="mla") if kind in ("mla", "dsa") else a


def layer_input(kind: str) -> str:
    """The saved tensor that is a layer's input: the first norm's (a hybrid half's own)."""
    return HYBRID_HALVES[kind].input if kind in HYBRID_HALVES else LAYER_INPUT


def microbatch_tokens(a: Architecture) -> int:
    return a.seq_length * a.micro_batch_size


def _mlp_tensors(a: Architecture, prefix: str, tokens: int, ffn: int) -> dict[str, float]:
    """fc1's (and fc3's) output, an eager SwiGLU's SiLU output (Architecture.
    swiglu_keeps_silu), the activation's output (fc2's input). fc1's input is counted by
    whoever produced it."""
    w = DTYPE_BYTES[a.dtype]
    out = {f"{prefix}.fc1_out": tokens * ffn * (2 if a.gated_mlp else 1) * w,
           f"{prefix}.act_out": tokens * ffn * w}
    if a.swiglu_keeps_silu:
        out[f"{prefix}.act_mid"] = tokens * ffn * w
    return out


def _weighting(a: Architecture, pairs: float, width: int) -> dict[str, float]:
    """What weighting the pairs by their routing probabilities keeps: in the experts'
    activation (Megatron: the fp32 probabilities, gathered over etp with the pairs, and
    where the product is eager, not fused into the SwiGLU, its unweighted factor), or
    after them (torchtitan: a hidden-wide tensor a pair, the experts' whole-width output:
    every tensor rank's pairs where the experts split over it)."""
    w = DTYPE_BYTES[a.dtype]
    if not a.probs_in_activation:
        return {"experts.out": pairs * width * w * a.expert_tp}
    out = {"experts.probs": pairs * 4 * a.expert_tp}
    if a.swiglu_keeps_silu or not a.gated_mlp:
        out["experts.act_pre"] = pairs * a.moe_ffn_hidden_size * w
    return out


def _norm(a: Architecture, name: str, width: int, input_bytes: int = 0) -> dict[str, float]:
    """A norm's input (`input_bytes` an element, default the training dtype's), its fp32
    statistics and its output."""
    w = DTYPE_BYTES[a.dtype]
    tok = microbatch_tokens(a)
    return {f"{name}.in": tok * width * (input_bytes or w),
            f"{name}.stats": tok * (4 if a.rmsnorm else 8), f"{name}.out": tok * width * w}


def saved_tensors(a: Architecture, kind: str) -> dict[str, float]:
    """Name -> bytes per tp rank of every tensor one microbatch's forward of a layer of
    `kind` keeps without any recompute (FlashAttention: no s x s scores); a hybrid
    stack's attention, MLP or MoE layer keeps its half's (HYBRID_HALVES)."""
    if kind in HYBRID_HALVES:
        return _half_tensors(a, kind)
    tok, h, w = microbatch_tokens(a), a.hidden_size, DTYPE_BYTES[a.dtype]
    sh = attention_shape(a)
    t: dict[str, float] = {**_norm(a, "norm1", h, a.residual_bytes)}  # the residual stream
    if a.attention == "mla":
        for name, rank in (("q_norm", a.q_lora_rank), ("kv_norm", a.kv_lora_rank)):
            if rank and a.qk_layernorm:
                t.update(_norm(a, name, rank))  # the latent, its stats, the up-projection input
            elif rank:  # no norm: the up projection keeps the latent
                t[f"{name.partition('_')[0]}_up.in"] = tok * rank * w
    held = held_attention_shape(a)  # keys and values as the ranks hold them
    t.update({"attn.q": tok * sh.q * w, "attn.k": tok * held.k * w,
              "attn.v": tok * held.v * w, "attn.out": tok * sh.out * w})
    t.update(unfused_tensors(a) if a.unfused_attention else {"attn.lse": 4 * tok * a.num_heads})
    t.update(qk_norm_and_gate(a))
    if a.dropout:
        t["drop1.mask"] = tok * h
        t["drop2.mask"] = tok * h
    t.update(_norm(a, "norm2", h, a.residual_bytes))
    if kind == "dense":
        t.update(_mlp_tensors(a, "mlp", tok, a.ffn_hidden_size))
    else:
        pairs = tok * a.top_k * a.expert_load
        t["router.probs"] = 2 * tok * a.num_experts * 4  # logits and probabilities, fp32
        # int64 indices: each token's top-k, and the permutations that sort the pairs by
        # expert and back (the dispatch's and the combine's backward gathers by them)
        t["router.indices"] = 3 * tok * a.top_k * 8
        width = a.moe_latent_size or h  # the experts' tokens, projected down
        # the dispatched tokens, gathered over the expert tp group: a grouped linear with
        # explicit expert communication keeps etp ranks' pairs at the whole width
        t["experts.fc1_in"] = pairs * width * w * a.expert_tp
        t.update(_mlp_tensors(a, "experts", pairs, a.moe_ffn_hidden_size))
        t.update(_weighting(a, pairs, width))
        if a.moe_latent_size:
            t["latent.fc2_in"] = tok * width * w  # the combined tokens, projected back up
        if a.shared_width:
            t.update(_mlp_tensors(a, "shared", tok, a.shared_width))
        if a.shared_width and a.ep > 1 and a.sequence_parallel and gathered(a):
            # the shared experts gather the rank's tokens (the router keeps them as they are)
            t[SHARED_INPUT] = tok * h * w
        if a.shared_width and a.shared_expert_gate:  # the gated product's inputs
            t.update({SHARED_GATE[0]: tok * h * w, SHARED_GATE[1]: tok * w})
    if a.fp8_copies:  # the FP8 linears keep their inputs in FP8 (ppsim.costs.fp8)
        f = fp8_bytes(a)
        t.update({n: v / w * f for n, v in t.items() if n in FP8_INPUTS})
        t[PROJ_INPUT] = tok * sh.out * f
        t.pop(GATED, None)  # the projection's FP8 copy is of the gated output
    return per_rank(a, t, kind)


def _half_tensors(a: Architecture, kind: str) -> dict[str, float]:
    half = HYBRID_HALVES[kind]
    t = {n: v for n, v in saved_tensors(half_arch(a, kind), half.base).items()
         if n.startswith(half.prefixes)}
    if kind == "dsa":  # the lightning indexer's queries, keys, weights and top-k indices
        n, d, w = a.dsa_indexer_n_heads, a.dsa_indexer_head_dim, DTYPE_BYTES[a.dtype]
        per_token = (n * d + d) * w + n * 4 + a.dsa_indexer_topk * 4
        t["dsa.indexer"] = microbatch_tokens(a) * per_token / a.tp
    return t
