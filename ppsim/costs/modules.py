"""What a memory policy does to a decoder layer, by Megatron module.

Megatron-Core's recompute modules (`--recompute-modules`) each drop a set of the
layer's saved tensors (ppsim.costs.saved: each once, by name, with its bytes per tp rank)
and repeat a set of forward ops inside the backward; its offload modules
(`--offload-modules`) each move a set of them to host memory after the forward and back
before the backward. Block recompute (`--recompute-method block`) of a layer keeps only
the layer's input.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.attention_tensors import (
    GATED,
    UNFUSED_TENSORS,
    scores_workspace,
)
from ppsim.costs.fp8 import PROJ_INPUT
from ppsim.costs.kv_split import qkv_gather_bytes
from ppsim.costs.layerops import layer_ops
from ppsim.costs.op_sac import (
    OP_SAC,
    OP_SAC_KINDS,
    OP_SAC_MODULE,
    half_matmul,
    op_sac_kept,
    op_sac_repeats,
    op_sac_transient,
)
from ppsim.costs.ops import Op
from ppsim.costs.saved import (
    HYBRID_HALVES,
    SHARED_GATE,
    half_arch,
    layer_input,
    microbatch_tokens,
    per_rank,
    saved_tensors,
)
from ppsim.costs.stack import KINDS, PAIRED_KINDS

RECOMPUTE_MODULES = ("core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "moe",
                     "shared_experts")
"""Megatron's --recompute-modules choices."""
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                   "expert_fc1", "moe_act")
"""Megatron's --offload-modules choices (each offloads the tensors its forward saves)."""

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
        own = separate_norms(half_arch(a, kind), half.base)
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
    halved_ops: frozenset[str] = frozenset()
    """Fused matmuls of which the backward runs one of two equal halves again."""
    whole_checkpoint: bool = False
    """The layer runs inside one checkpoint (block recompute, torchtitan's SelectiveAC):
    the weight copies its forward saves (FP8's) live inside the backward's recompute alone."""

    def ops_again(self, ops: list[Op]) -> list[Op]:
        """The forward work of `ops` the backward runs again (not under "*": the whole
        forward)."""
        return [op for op in ops if op.name in self.repeated_ops] \
            + [half_matmul(op) for op in ops if op.name in self.halved_ops]


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
        return module in half.modules and applies(module, half_arch(a, kind), half.base)
    if kind in PAIRED_KINDS:
        return any(applies(module, a, k) for k in PAIRED_KINDS[kind])
    if kind not in KINDS:
        return False
    if module in ("moe", "moe_act", "expert_fc1"):
        return kind == "moe"
    if module == "shared_experts":
        return kind == "moe" and a.shared_width > 0
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
        kept.update(per_rank(a, {"attn.k_rope": microbatch_tokens(a) * a.qk_rope_head_dim
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
                            repeated_ops=frozenset({"*"}), whole_checkpoint=True,
                            transient_bytes=max(int(sum(saved.values())) - kept
                                                + scores_workspace(a, saved),
                                                _gathered_qkv(a, kind)))
    if OP_SAC_MODULE in recompute:
        return _op_sac_effect(a, kind, offload)
    kept = kept_tensors(a, kind, recompute)
    moved = {n for m in offload if applies(m, a, kind) for n in _moves(a, m)} & set(kept)
    freed = moved - _held_elsewhere(a, kind, recompute, offload)
    return ModuleEffect(kept_bytes=int(sum(v for n, v in kept.items() if n not in freed)),
                        offloaded_bytes=int(sum(v for n, v in kept.items() if n in moved)),
                        freed_bytes=int(sum(v for n, v in kept.items() if n in freed)),
                        repeated_ops=_repeated(a, kind, recompute),
                        transient_bytes=max(_recomputed_bytes(a, kind, recompute, saved)
                                            + scores_workspace(a, saved),
                                            _gathered_qkv(a, kind)))


def _op_sac_effect(a: Architecture, kind: str, offload: tuple[str, ...]) -> ModuleEffect:
    """torchtitan's SelectiveAC on a dense or MoE layer (ppsim.costs.op_sac); it offloads
    nothing (Megatron's offload modules are not torchtitan's)."""
    if kind not in OP_SAC_KINDS or offload:
        raise ValueError(f"{OP_SAC} prices {OP_SAC_KINDS} layers without offload, not "
                         f"{kind!r} with {offload!r}")
    again, saved, kept = op_sac_repeats(a, kind), saved_tensors(a, kind), op_sac_kept(a, kind)
    return ModuleEffect(kept_bytes=int(sum(kept.values())), offloaded_bytes=0, freed_bytes=0,
                        repeated_ops=again.whole, halved_ops=again.halved,
                        transient_bytes=max(op_sac_transient(saved, kept)
                                            + scores_workspace(a, saved), _gathered_qkv(a, kind)),
                        whole_checkpoint=True)


def _gathered_qkv(a: Architecture, kind: str) -> int:
    """The gradient of the gathered QKV a rank's backward holds at tp above the
    key/value groups (the slices' backward fills a zero tensor of the gathered width,
    which the gather's backward reduce-scatters): after the core's backward, when the
    recomputed tensors and the scores' workspace are spent, so beside them the larger."""
    if kind in HYBRID_HALVES and "attn." not in HYBRID_HALVES[kind].prefixes:
        return 0
    return int(qkv_gather_bytes(half_arch(a, kind)))


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
    present = {op.name for op in layer_ops(half_arch(a, kind), base)}
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


SHORTHAND = {"none": (), "selective": ("core_attn",), OP_SAC: (OP_SAC_MODULE,)}
"""The global --recompute modes as module sets ("full": every layer block-recomputed)."""


def layer_activation_bytes(a: Architecture, kind: str) -> int:
    """Bytes one microbatch's forward of a layer keeps for the backward, per tp rank,
    under the architecture's global recompute mode."""
    if a.recompute == "full":
        return module_effect(a, kind, full=True).kept_bytes
    return module_effect(a, kind, SHORTHAND[a.recompute]).kept_bytes
