"""A decoder layer's saved tensors and ops by Megatron module: what a memory policy acts on.

Each tensor autograd keeps for the backward is listed once, by name, with its bytes
per tp rank (hidden-wide ones between the tensor-parallel blocks, TOKEN_SPLIT, split by
tokens only under sequence parallelism; the same counts as ppsim.costs.layerops: their sum is
`layer_activation_bytes`). Megatron-Core's recompute modules
(`--recompute-modules`) each drop a set of those tensors and repeat a set of forward
ops inside the backward; its offload modules (`--offload-modules`) each move a set
of them to host memory after the forward and back before the backward. Block
recompute (`--recompute-method block`) of a layer keeps only the layer's input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppsim.costs.arch import DTYPE_BYTES, KINDS, PAIRED_KINDS, Architecture, attention_shape
from ppsim.costs.attention_tensors import (
    GATED,
    UNFUSED_TENSORS,
    qk_norm_and_gate,
    scores_workspace,
    unfused_tensors,
)
from ppsim.costs.fp8 import FP8_INPUTS, PROJ_INPUT, fp8_bytes
from ppsim.costs.layerops import layer_ops

RECOMPUTE_MODULES = ("core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "moe",
                     "shared_experts")
"""Megatron's --recompute-modules choices."""
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                   "expert_fc1", "moe_act")
"""Megatron's --offload-modules choices (each offloads the tensors its forward saves)."""

SHARED_GATE = ("shared.out", "shared.gate_score")
"""What the shared experts' gate keeps: their output and its sigmoid score a token."""
# Tensors each recompute module stops keeping. Output-discarding checkpoints
# (layernorm, moe_act, mla_up_proj) free the module's output once its consumer has
# run; whole-module checkpoints (core_attn, mlp, moe, shared_experts) keep only
# their inputs, which their consumers' or producers' entries already count.
_DROPS = {
    # q, k, v are the checkpoint's inputs; out_proj keeps out
    "core_attn": ("attn.lse", *UNFUSED_TENSORS),
    "mlp": ("mlp.fc1_out", "mlp.act_mid", "mlp.act_out"),
    "moe": ("router.probs", "router.indices", "experts.fc1_in", "experts.fc1_out",
            "experts.act_mid", "experts.act_pre", "experts.act_out", "experts.probs",
            "experts.out", "shared.fc1_out", "shared.act_mid", "shared.act_out", *SHARED_GATE,
            "latent.fc2_in"),
    "moe_act": ("experts.act_mid", "experts.act_pre", "experts.act_out"),
    "layernorm": ("norm1.out", "norm1.stats", "norm2.out", "norm2.stats"),
    "mla_up_proj": ("attn.q", "attn.k", "attn.v"),
    "shared_experts": ("shared.fc1_out", "shared.act_mid", "shared.act_out", *SHARED_GATE),
}
# Forward ops each recompute module runs again before its backward.
_REPEATS = {
    "core_attn": ("attention", "attention.repeat_kv", "attention.scores",
                  "attention.softmax", "attention.dropout", "attention.context"),
    "mlp": ("mlp.fc1", "mlp.act", "mlp.fc2"),
    "moe": ("router", "router.softmax_topk", "latent.fc1", "dispatch", "experts.fc1",
            "experts.act", "experts.fc2", "combine", "combine.unfused", "latent.fc2",
            "shared.fc1", "shared.act", "shared.fc2", "shared.gate", "a2a"),
    "moe_act": ("experts.act",),
    "layernorm": ("norm1", "norm2"),
    "mla_up_proj": ("q_up", "kv_up", "rotary"),
    "shared_experts": ("shared.fc1", "shared.act", "shared.fc2", "shared.gate"),
}
# Tensors each offload module moves to the host.
_MOVES = {
    "attn_norm": ("norm1.in", "norm1.stats"),
    # Megatron offloads the query and key norms with the projection (both run inside
    # get_query_key_value_tensors, under the qkv_linear offload context).
    "qkv_linear": ("norm1.out", "qk_norm.in", "qk_norm.stats"),
    "core_attn": ("attn.q", "attn.k", "attn.v", "attn.out", "attn.lse", *UNFUSED_TENSORS),
    "attn_proj": ("attn.out",),
    "mlp_norm": ("norm2.in", "norm2.stats"),
    "expert_fc1": ("experts.fc1_in",),
    # an eager SwiGLU saves its SiLU too, an eager product its factors
    "moe_act": ("experts.fc1_out", "experts.act_mid", "experts.act_pre", "experts.probs"),
}


def separate_norms(a: Architecture, kind: str) -> tuple[str, ...]:
    """The norms of a decoder layer of `kind` that Megatron builds as modules of their own
    (Transformer Engine's layer spec, its default; the hybrid specs alike): the input
    norm before MLA's down projections, and the pre-MLP norm of a MoE layer, whose router
    and experts both read its output. The others are fused into the next linear
    (TELayerNormColumnParallelLinear: QKV, the dense MLP's fc1), which keeps the norm's
    output as its own input: TransformerLayer skips such a norm (an IdentityOp) for the
    `layernorm` recompute and the `attn_norm` / `mlp_norm` offload."""
    if kind in HYBRID_HALVES:
        half = HYBRID_HALVES[kind]
        own = separate_norms(_half_arch(a, kind), half.base)
        return tuple(n for n in own if n + "." in half.prefixes)
    norm1 = ("norm1",) if a.attention == "mla" else ()
    return norm1 + (("norm2",) if kind == "moe" else ())


def _drops(a: Architecture, module: str, kind: str) -> tuple[str, ...]:
    """What a recompute module stops keeping in a layer of `kind`: `layernorm` the
    outputs and statistics of its separate norms; under FP8 recomputed attention frees
    its bf16 output too (the projection keeps an FP8 copy), unless an output gate keeps
    it."""
    if module == "layernorm":
        norms = separate_norms(a, kind)
        return tuple(n for n in _DROPS[module] if n.partition(".")[0] in norms)
    extra = ("attn.out",) if (a.fp8_copies and module == "core_attn"
                              and not a.attention_output_gate) else ()
    return _DROPS[module] + extra


def _moves(a: Architecture, module: str) -> tuple[str, ...]:
    """What an offload module moves: the projection's input is its FP8 copy under FP8,
    the gated output under an output gate; an unfused core saves no output (its second
    matmul keeps its inputs)."""
    if module == "attn_proj":
        return (PROJ_INPUT,) if a.fp8_copies else (GATED,) if a.attention_output_gate \
            else _MOVES[module]
    if a.unfused_attention and module == "core_attn":
        return tuple(n for n in _MOVES[module] if n != "attn.out")
    return _MOVES[module]


TOKEN_SPLIT = ("norm1.", "norm2.", "q_norm.", "kv_norm.", "q_up.in", "kv_up.in", "drop1.",
               "drop2.", "attn.k_rope")
"""The saved tensors (by name prefix) that are hidden-wide or a latent between the
tensor-parallel blocks: split over Architecture.token_ranks, the rest by width over tp.
(A MoE layer's are all over tp: Megatron runs MoE with tp > 1 only under sequence
parallelism.)"""


def _per_rank(a: Architecture, tensors: dict[str, float]) -> dict[str, float]:
    """Whole tensors' bytes as one tensor rank holds them."""
    return {k: v / (a.token_ranks if k.startswith(TOKEN_SPLIT) else a.tp)
            for k, v in tensors.items()}


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


def _half_arch(a: Architecture, kind: str) -> Architecture:
    """The architecture a hybrid half runs: '+' and 'D' layers are MLA (ppsim.costs.mixers)."""
    return replace(a, attention="mla") if kind in ("mla", "dsa") else a


def layer_input(kind: str) -> str:
    """The saved tensor that is a layer's input: the first norm's (a hybrid half's own)."""
    return HYBRID_HALVES[kind].input if kind in HYBRID_HALVES else LAYER_INPUT


def _tokens(a: Architecture) -> int:
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
    after them (torchtitan: a hidden-wide tensor a pair)."""
    w = DTYPE_BYTES[a.dtype]
    if not a.probs_in_activation:
        return {"experts.out": pairs * width * w}
    out = {"experts.probs": pairs * 4 * a.expert_tp}
    if a.swiglu_keeps_silu or not a.gated_mlp:
        out["experts.act_pre"] = pairs * a.moe_ffn_hidden_size * w
    return out


def _norm(a: Architecture, name: str, width: int, input_bytes: int = 0) -> dict[str, float]:
    """A norm's input (`input_bytes` an element, default the training dtype's), its fp32
    statistics and its output."""
    w = DTYPE_BYTES[a.dtype]
    tok = _tokens(a)
    return {f"{name}.in": tok * width * (input_bytes or w),
            f"{name}.stats": tok * (4 if a.rmsnorm else 8), f"{name}.out": tok * width * w}


def saved_tensors(a: Architecture, kind: str) -> dict[str, float]:
    """Name -> bytes per tp rank of every tensor one microbatch's forward of a layer of
    `kind` keeps without any recompute (FlashAttention: no s x s scores); a hybrid
    stack's attention, MLP or MoE layer keeps its half's (HYBRID_HALVES)."""
    if kind in HYBRID_HALVES:
        return _half_tensors(a, kind)
    tok, h, w = _tokens(a), a.hidden_size, DTYPE_BYTES[a.dtype]
    sh = attention_shape(a)
    t: dict[str, float] = {**_norm(a, "norm1", h, a.residual_bytes)}  # the residual stream
    if a.attention == "mla":
        for name, rank in (("q_norm", a.q_lora_rank), ("kv_norm", a.kv_lora_rank)):
            if rank and a.qk_layernorm:
                t.update(_norm(a, name, rank))  # the latent, its stats, the up-projection input
            elif rank:  # no norm: the up projection keeps the latent
                t[f"{name.partition('_')[0]}_up.in"] = tok * rank * w
    t.update({"attn.q": tok * sh.q * w, "attn.k": tok * sh.k * w, "attn.v": tok * sh.v * w,
              "attn.out": tok * sh.out * w})
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
        if a.shared_experts:
            t.update(_mlp_tensors(a, "shared", tok, a.shared_experts * a.moe_ffn_hidden_size))
        if a.shared_experts and a.shared_expert_gate:  # the gated product's inputs
            t.update({SHARED_GATE[0]: tok * h * w, SHARED_GATE[1]: tok * w})
    if a.fp8_copies:  # the FP8 linears keep their inputs in FP8 (ppsim.costs.fp8)
        f = fp8_bytes(a)
        t.update({n: v / w * f for n, v in t.items() if n in FP8_INPUTS})
        t[PROJ_INPUT] = tok * sh.out * f
        t.pop(GATED, None)  # the projection's FP8 copy is of the gated output
    return _per_rank(a, t)


def _half_tensors(a: Architecture, kind: str) -> dict[str, float]:
    half = HYBRID_HALVES[kind]
    t = {n: v for n, v in saved_tensors(_half_arch(a, kind), half.base).items()
         if n.startswith(half.prefixes)}
    if kind == "dsa":  # the lightning indexer's queries, keys, weights and top-k indices
        n, d, w = a.dsa_indexer_n_heads, a.dsa_indexer_head_dim, DTYPE_BYTES[a.dtype]
        t["dsa.indexer"] = _tokens(a) * ((n * d + d) * w + n * 4 + a.dsa_indexer_topk * 4) / a.tp
    return t


@dataclass(frozen=True, kw_only=True)
class ModuleEffect:
    """What a set of recompute and offload modules does to one layer of one kind."""

    kept_bytes: int
    """Bytes the layer keeps on the device per microbatch until its backward."""
    offloaded_bytes: int
    """Bytes moved to host memory (and back) per microbatch, at fraction 1."""
    freed_bytes: int
    """Of those, the bytes that leave the device: a tensor another piece saves too, and
    that piece is not offloaded, is copied but stays."""
    repeated_ops: frozenset[str]
    """Forward ops run again inside the backward."""
    transient_bytes: int = 0
    """Bytes a recompute brings back inside the backward, at its largest: the whole
    layer's tensors less its input, or one recompute module's dropped and remade tensors
    (each module's checkpoint runs again just before its own backward)."""


_NORM_MODULES = {"layernorm": ("norm1", "norm2"), "attn_norm": ("norm1",),
                 "mlp_norm": ("norm2",)}
"""The recompute and offload modules that act on a norm, and which norms (separate_norms
says where one exists)."""


def applies(module: str, a: Architecture, kind: str) -> bool:
    """A module exists in a layer of this kind (Megatron ignores the others there); a
    hybrid stack's attention, MLP and MoE layers have their half's (HYBRID_HALVES), its
    Mamba and GatedDeltaNet layers none."""
    if kind in HYBRID_HALVES:
        half = HYBRID_HALVES[kind]
        return module in half.modules and applies(module, _half_arch(a, kind), half.base)
    if kind in PAIRED_KINDS:
        return any(applies(module, a, k) for k in PAIRED_KINDS[kind])
    if kind not in KINDS:
        return False
    if module in ("moe", "moe_act", "expert_fc1"):
        return kind == "moe"
    if module == "shared_experts":
        return kind == "moe" and a.shared_experts > 0
    if module == "mlp":
        return kind == "dense"
    if module == "mla_up_proj":
        return a.attention == "mla"
    if module in _NORM_MODULES:
        return bool(set(_NORM_MODULES[module]) & set(separate_norms(a, kind)))
    return True


def kept_tensors(a: Architecture, kind: str, recompute: tuple[str, ...] = ()
                 ) -> dict[str, float]:
    """saved_tensors of a layer less those the `recompute` modules drop."""
    dropped = {n for m in recompute if applies(m, a, kind) for n in _drops(a, m, kind)}
    kept = {n: v for n, v in saved_tensors(a, kind).items() if n not in dropped}
    if "mla_up_proj" in recompute and applies("mla_up_proj", a, kind):
        # Its checkpoint keeps its inputs: the latents (kept by the up projections anyway)
        # and the keys' shared rotary part, which nothing keeps without it.
        kept.update(_per_rank(a, {"attn.k_rope": _tokens(a) * a.qk_rope_head_dim
                                                 * DTYPE_BYTES[a.dtype]}))
    return kept


def module_effect(a: Architecture, kind: str, recompute: tuple[str, ...] = (),
                  offload: tuple[str, ...] = (), full: bool = False) -> ModuleEffect:
    """Kept and offloaded bytes and repeated ops of a layer under these modules; `full`:
    the whole layer recomputed (Megatron's block method), keeping only its input."""
    saved = saved_tensors(a, kind)
    if full:
        kept = int(saved[layer_input(kind)])
        return ModuleEffect(kept_bytes=kept, offloaded_bytes=0, freed_bytes=0,
                            repeated_ops=frozenset({"*"}),
                            transient_bytes=int(sum(saved.values())) - kept
                            + scores_workspace(a, saved))
    kept = kept_tensors(a, kind, recompute)
    moved = {n for m in offload if applies(m, a, kind) for n in _moves(a, m)} & set(kept)
    freed = moved - _held_elsewhere(a, kind, recompute, offload)
    return ModuleEffect(kept_bytes=int(sum(v for n, v in kept.items() if n not in freed)),
                        offloaded_bytes=int(sum(v for n, v in kept.items() if n in moved)),
                        freed_bytes=int(sum(v for n, v in kept.items() if n in freed)),
                        repeated_ops=_repeated(a, kind, recompute),
                        transient_bytes=_recomputed_bytes(a, kind, recompute, saved)
                        + scores_workspace(a, saved))


_REMADE = {"core_attn": ("attn.out",)}
"""Tensors a recompute module's forward makes again though another piece keeps the first:
attention's output, which the output projection keeps as its input (and FlashAttention's
backward takes the recomputed one)."""


def _recomputed_bytes(a: Architecture, kind: str, recompute: tuple[str, ...],
                      saved: dict[str, float]) -> int:
    """The most bytes one recompute module's checkpoint brings back: what it dropped and
    what it makes again."""
    return int(max((sum(saved.get(n, 0) for n in {*_drops(a, m, kind), *_REMADE.get(m, ())})
                    for m in recompute if applies(m, a, kind)), default=0))


def _repeated(a: Architecture, kind: str, recompute: tuple[str, ...]) -> frozenset[str]:
    """The forward ops the recompute modules run again, of those the layer has (a hybrid
    layer's one norm is "norm": ppsim.costs.mixers)."""
    ops = {op for m in recompute if applies(m, a, kind) for op in _REPEATS[m]}
    ops -= {"norm1", "norm2"} - set(separate_norms(a, kind))  # fused norms run no more
    base = HYBRID_HALVES[kind].base if kind in HYBRID_HALVES else kind
    present = {op.name for op in layer_ops(_half_arch(a, kind), base)}
    present |= {"a2a"} if base == "moe" else set()
    if kind in HYBRID_HALVES:
        ops = {"norm" if op in ("norm1", "norm2") else op for op in ops}
        present.add("norm")
    return frozenset(ops & present)


def _held_elsewhere(a: Architecture, kind: str, recompute: tuple[str, ...],
                    offload: tuple[str, ...]) -> set[str]:
    """Tensors two pieces save, one of them not offloaded: copied to the host, but kept on
    the device too. Attention's output is saved by attention (unless recomputed, or
    unfused) and by the output projection; with mla_up_proj and no query latent, the
    layer's normed input is an input of the up projection's checkpoint as well as of the
    latents'."""
    out_savers = {"attn_proj"} | (set() if "core_attn" in recompute or a.unfused_attention
                                  else {"core_attn"})
    # under FP8 the projection keeps its own copy (PROJ_INPUT): attention's is one saver's
    held = set() if a.fp8_copies or out_savers <= set(offload) else {"attn.out"}
    if a.attention_output_gate:  # the gate keeps attention's output too, never offloaded
        held.add("attn.out")
    if "mla_up_proj" in recompute and applies("mla_up_proj", a, kind) and not a.q_lora_rank:
        held.add("norm1.out")
    return held


def offloaded_input_bytes(a: Architecture, kind: str, recompute: tuple[str, ...] = (),
                          offload: tuple[str, ...] = ()) -> int:
    """Of what the offload modules move off a layer, its input's bytes (`attn_norm`
    moves the norm's input, the residual stream the layer takes)."""
    moved = {n for m in offload if applies(m, a, kind) for n in _moves(a, m)}
    name = layer_input(kind)
    if name not in moved:
        return 0
    kept = kept_tensors(a, kind, recompute)
    return int(kept[name]) if name in kept else 0


SHORTHAND = {"none": (), "selective": ("core_attn",)}
"""The global --recompute modes as module sets ("full": every layer block-recomputed)."""


def layer_activation_bytes(a: Architecture, kind: str) -> int:
    """Bytes one microbatch's forward of a layer keeps for the backward, per tp rank,
    under the architecture's global recompute mode."""
    if a.recompute == "full":
        return module_effect(a, kind, full=True).kept_bytes
    return module_effect(a, kind, SHORTHAND[a.recompute]).kept_bytes
