"""Megatron's model arguments (--hidden-size, --swiglu, --num-experts, ...) as the [model]
fields they set, so a launch script's MODEL_ARGS pasted after a ppsim command describes
the model. Over a preset or a config's transformer they change only what they name;
with nothing to start from they build the model with Megatron's own defaults (its
arguments.py and TransformerConfig: a 4h GeLU MLP, LayerNorm, learned positions, tied
embeddings, dropout 0.1, fp32 unless --bf16 or --fp16, biased linears unless
--disable-bias-linear).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ppsim.cli.megatron_attention import (
    ATTENTION_BACKENDS,
    TRANSFORMER_IMPLS,
    attention_fields,
    context_parallel_fields,
    unfused_backend,
)
from ppsim.cli.megatron_moe import check_dsa_sizes, moe_fields
from ppsim.cli.megatron_precision import precision_fields
from ppsim.cli.megatron_router import add_router_flags, check_router
from ppsim.cli.megatron_run import PREFIX
from ppsim.config.model import TOP_K_FIX, Model, TransformerModel, parse_model
from ppsim.costs.choices import MEGATRON_FP8_FORMATS, MUON_TP_MODES, OPTIMIZERS
from ppsim.errors import UserError

INT_FLAGS = {
    "hidden-size": "hidden_size", "num-attention-heads": "num_heads",
    "ffn-hidden-size": "ffn_hidden_size", "vocab-size": "vocab_size",
    "num-experts": "num_experts", "moe-router-topk": "top_k",
    "moe-ffn-hidden-size": "moe_ffn_hidden_size", "moe-latent-size": "moe_latent_size",
    "q-lora-rank": "q_lora_rank",
    "kv-lora-rank": "kv_lora_rank", "qk-pos-emb-head-dim": "qk_rope_head_dim",
    "v-head-dim": "v_head_dim", "mamba-state-dim": "mamba_state_dim",
    "mamba-head-dim": "mamba_head_dim", "mamba-num-groups": "mamba_num_groups",
    "mamba-num-heads": "mamba_num_heads", "linear-num-key-heads": "linear_num_key_heads",
    "linear-num-value-heads": "linear_num_value_heads",
    "linear-key-head-dim": "linear_key_head_dim",
    "linear-value-head-dim": "linear_value_head_dim",
    "linear-conv-kernel-dim": "linear_conv_kernel_dim",
    "dsa-indexer-n-heads": "dsa_indexer_n_heads", "dsa-indexer-head-dim": "dsa_indexer_head_dim",
    "dsa-indexer-topk": "dsa_indexer_topk",
    "max-position-embeddings": "max_position_embeddings",
}
"""Megatron flag -> the [model] field it sets, value as given."""
ARCH_DESTS = (*(f.replace("-", "_") for f in INT_FLAGS), "num_query_groups",
              "group_query_attention", "kv_channels", "qk_head_dim", "swiglu", "normalization",
              "position_embedding_type", "use_rotary_position_embeddings",
              "add_position_embedding", "untie_embeddings_and_output_weights", "bf16", "fp16",
              "hidden_dropout", "attention_dropout", "multi_latent_attention",
              "moe_shared_expert_intermediate_size", "moe_layer_freq", "window_size",
              "window_attn_skip_freq", "quick_geglu", "moe_expert_capacity_factor",
              "moe_pad_expert_input_to_capacity", "make_vocab_size_divisible_by",
              "padded_vocab_size", "fp8_format", "fp8_recipe", "fp8_param_gather",
              "first_last_layers_bf16", "num_layers_at_start_in_bf16",
              "num_layers_at_end_in_bf16", "fp4_format", "fp4_recipe", "fp4_param_gather",
              "cp_comm_type",
              "hierarchical_context_parallel_sizes", "optimizer",
              "muon_num_ns_steps", "muon_tp_mode", "qk_layernorm", "attention_output_gate",
              "fp32_residual_connection",
              "qk_l2_norm", "moe_shared_expert_gate", "moe_permute_fusion",
              "experimental_attention_variant", "linear_attention_freq")
"""Every flag of the group that changes the model (the rest are accepted and ignored)."""
IGNORED = {"norm-epsilon": float, "rotary-base": float,
           "rotary-percent": float, "init-method-std": float,
           "attention-softmax-in-fp32": None, "use-flash-attn": None,
           "use-mcore-models": None,
           "moe-router-topk-scaling-factor": float, "moe-router-bias-update-rate": float,
           "moe-z-loss-coeff": float,
           "apply-layernorm-1p": None, "squared-relu": None,
           "fp8-amax-history-len": int, "fp8-amax-compute-algo": str,
           "fp8-margin": int, "spec": [str],
           "rope-type": str, "rotary-scaling-factor": float, "mscale": float,
           "mscale-all-dim": float, "add-qkv-bias": None, "rotary-interleaved": None,
           "rotary-seq-len-interpolation-factor": float, "use-rope-scaling": None,
           "rope-scaling-factor": float, "no-rope-freq": str, "is-hybrid-model": None,
           "glu-linear-offset": float, "softmax-type": str,
           "activation-func-clamp-value": float, "moe-router-fusion": None,
           "moe-router-force-load-balancing": None, "moe-router-padding-for-fp8": None,
           "moe-router-padding-for-quantization": None, "mtp-loss-scaling-factor": float,
           "apply-query-key-layer-scaling": None, "openai-gelu": None, "onnx-safe": [str],
           "yarn-beta-fast": float, "yarn-beta-slow": float,
           "yarn-correction-range-round-to-int": None,
           "no-yarn-correction-range-round-to-int": None,
           "yarn-original-max-position-embeddings": int, "mrope-section": [int],
           "moe-input-jitter-eps": float, "moe-router-force-biased": float,
           "moe-apply-probs-on-input": None, "dsa-indexer-k-norm-fp32": None,
           "dsa-indexer-k-norm-epsilon": float, "dsa-indexer-rope-interleaved": None,
           "dsa-indexer-skip-topk-offset": int, "no-dsa-indexer-rotate-activation": None,
           "no-dsa-indexer-scoring-relu": None}
"""Accepted as Megatron takes them; ppsim's costs do not depend on them (FP8's scaling
knobs change neither the matmuls nor what is kept; --spec names the builder of the layers
the model arguments describe; the router's checked flags: megatron_router.py; YaRN's
and Llama's rope scaling, layers without rope and the query/key/value biases (3 widths a
layer) change no cost, nor do gpt-oss's attention sinks (one logit a head) and its GLU's
offset and clamp; the router is priced fused and even, which is what its fusion and forced
balancing give, and padding each expert's tokens to a multiple of 16 for FP8 adds at most
15 rows an expert; MTP's loss scale weighs the loss).
None: a switch; [type]: one or more values."""
POSITIONS = {"learned_absolute": "learned", "rope": "rotary", "yarn": "rotary",
             "mrope": "rotary", "none": "none"}
REQUIRED = (("num_layers", "--num-layers"), ("hidden_size", "--hidden-size"),
            ("num_heads", "--num-attention-heads"), ("seq_length", "--seq-length"),
            ("vocab_size", "--vocab-size"))
"""What Megatron needs to build a model and ppsim cannot default (the vocabulary comes
from Megatron's tokenizer, so it is asked for here)."""
GPT2_BPE_VOCAB = 50257
"""Tokens in GPT-2's byte-level BPE (its gpt2-vocab.json): the vocabulary Megatron's
GPT2BPETokenizer reports, before Megatron pads it."""
MLA_DEFAULTS = {"kv_lora_rank": 32, "head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
"""Megatron's --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim."""
SWITCHES = ("group-query-attention", "swiglu", "untie-embeddings-and-output-weights", "bf16",
            "fp16", "multi-latent-attention", "use-rotary-position-embeddings", "quick-geglu",
            "qk-layernorm", "qk-l2-norm", "attention-output-gate", "moe-shared-expert-gate",
            "moe-permute-fusion", "fp32-residual-connection", "disable-bias-linear")
"""Model flags without a value (flag_fields reads them)."""
OTHER_INTS = ("num-query-groups", "kv-channels", "qk-head-dim",
              "moe-shared-expert-intermediate-size", "make-vocab-size-divisible-by",
              "padded-vocab-size")
"""Model flags with a whole number that flag_fields turns into fields (or refuses)."""


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Megatron's model arguments, under the names its launch scripts use."""
    g = p.add_argument_group(
        "model (Megatron's names)", "a launch script's model arguments, as Megatron takes "
        "them: --hidden-size, --num-attention-heads, --swiglu, --num-experts, --vocab-size, "
        "--fp8-format, --experimental-attention-variant gdn|dsa, ... (the list: "
        "docs/model.md); over --preset or the config's transformer they change what they "
        "name, alone they build the model with Megatron's defaults")
    g.add_argument("--seq-length", type=int, metavar="N", help="tokens per sequence")
    g.add_argument("--micro-batch-size", type=int, metavar="N", help="sequences per microbatch")
    hidden = argparse.SUPPRESS  # listed once in the group's description
    for flag in (*INT_FLAGS, *OTHER_INTS):
        g.add_argument(f"--{flag}", type=int, help=hidden)
    for flag in SWITCHES:
        g.add_argument(f"--{flag}", action="store_true", default=None, help=hidden)
    g.add_argument("--no-position-embedding", dest="add_position_embedding",
                   action="store_false", default=None, help=hidden)
    g.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), help=hidden)
    g.add_argument("--position-embedding-type", help=hidden)
    for flag in ("hidden-dropout", "attention-dropout"):
        g.add_argument(f"--{flag}", type=float, help=hidden)
    g.add_argument("--moe-layer-freq", help=hidden)
    g.add_argument("--window-size", help=hidden)
    g.add_argument("--moe-expert-capacity-factor", type=float, help=hidden)
    g.add_argument("--moe-pad-expert-input-to-capacity", action="store_true", default=None,
                   help=hidden)
    g.add_argument("--window-attn-skip-freq", help=hidden)
    g.add_argument("--experimental-attention-variant", help=hidden)
    g.add_argument("--linear-attention-freq", help=hidden)
    add_router_flags(g)
    for flag, kind in IGNORED.items():
        if kind is None:
            g.add_argument(f"--{flag}", action="store_true", default=None, help=hidden)
        elif isinstance(kind, list):
            g.add_argument(f"--{flag}", nargs="+", type=kind[0], help=hidden)
        else:
            g.add_argument(f"--{flag}", type=kind, help=hidden)
    g.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, help=hidden)
    g.add_argument("--transformer-impl", choices=TRANSFORMER_IMPLS, help=hidden)
    g.add_argument("--cp-comm-type", nargs="+", help=hidden)
    g.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, help=hidden)
    g.add_argument("--optimizer", help=hidden)
    g.add_argument("--muon-num-ns-steps", type=int, help=hidden)
    g.add_argument("--muon-tp-mode", choices=MUON_TP_MODES, help=hidden)
    g.add_argument("--fp8-format", choices=MEGATRON_FP8_FORMATS, help=hidden)
    g.add_argument("--fp8-recipe", help=hidden)
    g.add_argument("--fp4-format", help=hidden)
    g.add_argument("--fp4-recipe", help=hidden)
    for flag in ("fp8-param-gather", "fp4-param-gather", "first-last-layers-bf16"):
        g.add_argument(f"--{flag}", action="store_true", default=None, help=hidden)
    for flag in ("num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16"):
        g.add_argument(f"--{flag}", type=int, help=hidden)
    g.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall", "flex"),
                   help=hidden)
    g.add_argument("--moe-flex-dispatcher-backend", choices=("deepep", "hybridep", "ncclep"),
                   help=hidden)
    g.add_argument("--moe-enable-deepep", action="store_true", default=None, help=hidden)
    for flag in ("moe-flex-dispatcher-num-sms", "moe-deepep-num-sms", "moe-hybridep-num-sms"):
        g.add_argument(f"--{flag}", type=int, help=hidden)


def given(args: argparse.Namespace) -> bool:
    """Whether any flag that changes the model was given (--mtp-num-layers too)."""
    return any(getattr(args, d, None) is not None for d in (*ARCH_DESTS, "mtp_num_layers")) \
        or bool(unfused_backend(args))


def model_table(args: argparse.Namespace, base: Model | None) -> dict[str, Any] | None:
    """The [model] table the flags describe: `base` (a preset's or a config's transformer)
    with what they name changed, or, over nothing (the embedded default) or a uniform
    model, a transformer built with Megatron's defaults. None when no model flag was
    given."""
    known = base.fields() if isinstance(base, TransformerModel) else {}
    check_router(args, known)
    if not given(args):
        return None
    if getattr(args, "num_layers", None) is not None:
        known["num_layers"] = args.num_layers
    fields = flag_fields(args, known)
    if "experimental_attention_variant" in fields \
            and getattr(args, "hybrid_layer_pattern", None) is None:
        fields["hybrid_layer_pattern"] = ""  # a GPT model's layers over a hybrid stack's
    if isinstance(base, TransformerModel):
        check_dsa_sizes(fields, {**base.to_dict(), **fields}, known.get("attention"))
        return _with_mtp_depth(args, {**base.to_dict(), **fields})
    extra = {k: getattr(args, k, None) for k in ("num_layers", "seq_length",
                                                 "micro_batch_size", "hybrid_layer_pattern")}
    extra["mtp_layers"] = getattr(args, "mtp_num_layers", None)
    fields.update({k: v for k, v in extra.items() if v is not None})
    if "vocab_size" not in fields and _tokenizer(args) == "GPT2BPETokenizer":
        fields["vocab_size"] = GPT2_BPE_VOCAB
        print(f"note: vocabulary {GPT2_BPE_VOCAB:,} from --tokenizer-type GPT2BPETokenizer "
              "(GPT-2's BPE), padded as Megatron pads it", file=sys.stderr)
    for key, flag in REQUIRED:
        if key not in fields and not (key == "num_layers" and "hybrid_layer_pattern" in fields):
            also = " (or --padded-vocab-size N)" * (flag == "--vocab-size")
            gpt2 = (f"; GPT-2's BPE files: --tokenizer-type GPT2BPETokenizer gives its "
                    f"{GPT2_BPE_VOCAB:,} tokens") * (
                flag == "--vocab-size" and bool(getattr(args, PREFIX + "merge_file", None)))
            raise UserError(flag, "needed to build the model from Megatron's flags (no "
                            "--preset or [model] transformer to start from)",
                            f"add {flag} N{also}, or give --preset NAME: without one the "
                            f"flags build the model, over no embedded default{gpt2}")
    check_dsa_sizes(fields, fields, fields.get("attention"))
    return {"kind": "transformer", **megatron_defaults(fields)}


def _tokenizer(args: argparse.Namespace) -> str | None:
    """--tokenizer-type's value (a launch line's run argument, taken with any values)."""
    given = getattr(args, PREFIX + "tokenizer_type", None)
    return given[0] if given and len(given) == 1 else None


def _with_mtp_depth(args: argparse.Namespace, table: dict[str, Any]) -> dict[str, Any]:
    """`table` with --mtp-num-layers's depth, as Megatron sets it over any model (0: none);
    a hybrid pattern names its own depths and keeps them (the flag's check warns)."""
    mtp = getattr(args, "mtp_num_layers", None)
    if mtp is None or parse_model(table).fields().get("hybrid_layer_pattern"):
        return table
    return {**table, "mtp_layers": mtp}


def flag_fields(args: argparse.Namespace, known: dict[str, Any]) -> dict[str, Any]:
    """The [model] fields the given flags set, and only those (`known`: the fields the
    model has already, which --moe-layer-freq and the shared experts' size need)."""
    get = lambda dest: getattr(args, dest, None)  # noqa: E731
    if (k := get("moe_router_topk")) is not None and k < 1:
        raise UserError("--moe-router-topk", f"must be at least 1, got {k}", TOP_K_FIX)
    out: dict[str, Any] = {field: get(flag.replace("-", "_"))
                           for flag, field in INT_FLAGS.items()}
    out = {k: v for k, v in out.items() if v is not None}
    if get("padded_vocab_size") is not None:
        # Megatron takes --padded-vocab-size as it is, over --vocab-size (argument_utils.py)
        out.update(vocab_size=get("padded_vocab_size"), pad_vocab=False)
    elif get("vocab_size") is not None:
        out["pad_vocab"] = True
    if get("group_query_attention"):
        out["num_kv_heads"] = get("num_query_groups") or 1  # Megatron's default: 1 group
    elif get("num_query_groups") is not None:
        print(f"warning: --num-query-groups {get('num_query_groups')} ignored without "
              "--group-query-attention, as Megatron ignores it", file=sys.stderr)
    if get("multi_latent_attention"):
        out["attention"] = "mla"
    head_dim = get("qk_head_dim") if get("multi_latent_attention") else get("kv_channels")
    if head_dim is not None:
        out["head_dim"] = head_dim
    if get("swiglu") and get("quick_geglu"):
        raise UserError("--quick-geglu", "and --swiglu both given", "give one of them")
    if get("swiglu") or get("quick_geglu"):  # both gate the MLP: three matrices
        out["gated_mlp"] = True
        out["gated_activation"] = "quick_geglu" if get("quick_geglu") else "swiglu"
    out.update(attention_fields(args, known))
    if get("moe_shared_expert_gate"):
        out["shared_expert_gate"] = True
    if get("moe_permute_fusion"):
        out["moe_permute_fusion"] = True
    if get("normalization") is not None:
        out["norm"] = get("normalization").lower()
    position = _position(args)
    if position is not None:
        out["position"] = position
    if get("untie_embeddings_and_output_weights"):
        out["tie_embeddings"] = False
    if get("disable_bias_linear"):
        out["linear_bias"] = False
    out.update(precision_fields(get))
    out.update(context_parallel_fields(get, known))
    out.update(_optimizer_fields(get))
    out.update(_dtype_fields(get))
    out.update(_dropout_fields(get, known))
    out.update(moe_fields(args, {**known, **out}))
    divisor = get("make_vocab_size_divisible_by")
    if divisor is not None:
        out["vocab_divisor"] = divisor
    return out


def _dtype_fields(get: Any) -> dict[str, Any]:
    """--bf16 or --fp16 (not both) and --fp32-residual-connection as fields."""
    out: dict[str, Any] = {}
    if get("bf16") and get("fp16"):
        raise UserError("--bf16", "and --fp16 both given", "give one of them")
    if get("bf16") or get("fp16"):
        out["dtype"] = "bf16" if get("bf16") else "fp16"
    if get("fp32_residual_connection"):
        out["fp32_residual"] = True
    return out


def _dropout_fields(get: Any, known: dict[str, Any]) -> dict[str, Any]:
    """--hidden-dropout and --attention-dropout as the model's one dropout switch."""
    drops = {f: get(f) for f in ("hidden_dropout", "attention_dropout") if get(f) is not None}
    for dest, p in drops.items():
        if not 0 <= p < 1:  # nan fails too
            raise UserError("--" + dest.replace("_", "-"), f"dropout probabilities must be "
                            f"in [0, 1), got {p}", "give e.g. 0.1, or 0 for none")
    if not drops:
        return {}
    # The one not given keeps the model's dropout (Megatron's default 0.1).
    kept = 0.1 if known.get("dropout", True) else 0.0
    return {"dropout": any(drops.get(f, kept) > 0 for f in ("hidden_dropout",
                                                           "attention_dropout"))}


def _optimizer_fields(get: Any) -> dict[str, Any]:
    """--optimizer (adam or muon; dist_muon, deprecated, is muon with the distributed
    optimizer, as Megatron turns it), --muon-num-ns-steps and --muon-tp-mode as fields."""
    out: dict[str, Any] = {"muon_ns_steps": get("muon_num_ns_steps"),
                           "muon_tp_mode": get("muon_tp_mode")}
    name = get("optimizer")
    if name == "dist_muon":
        out.update(optimizer="muon", distributed_optimizer=True)
    elif name is not None and name not in OPTIMIZERS:
        raise UserError("--optimizer", f"{name!r} keeps other states than Adam's or Muon's, "
                        "which ppsim does not price", "give --optimizer adam or muon")
    elif name is not None:
        out["optimizer"] = name
    return {k: v for k, v in out.items() if v is not None}


def megatron_defaults(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` completed as Megatron completes its arguments for a new model."""
    out = {"gated_mlp": False, "norm": "layernorm", "position": "learned",
           "tie_embeddings": True, "dropout": True, "dtype": "fp32", "linear_bias": True,
           **fields}
    out.setdefault("num_kv_heads", out["num_heads"])
    if "ffn_hidden_size" not in out:  # arguments.py: 4h, or 2/3 of it for SwiGLU
        h = out["hidden_size"]
        out["ffn_hidden_size"] = int((4 * h * 2 / 3) / 64) * 64 if out["gated_mlp"] else 4 * h
    if out.get("num_experts"):  # Megatron's torch permutation unless the flag fuses it
        out.setdefault("moe_permute_fusion", False)
    if out.get("attention") == "mla":
        for key, value in MLA_DEFAULTS.items():
            out.setdefault(key, value)
    return out


def _position(args: argparse.Namespace) -> str | None:
    kind = getattr(args, "position_embedding_type", None)
    if getattr(args, "use_rotary_position_embeddings", None):
        kind = "rope"
    if getattr(args, "add_position_embedding", None) is False:
        kind = "none"
    if kind is None:
        return None
    if kind not in POSITIONS:
        raise UserError("--position-embedding-type", f"{kind!r}: ppsim prices "
                        "learned_absolute, rope (yarn, mrope) and none",
                        "give one of them")
    return POSITIONS[kind]
