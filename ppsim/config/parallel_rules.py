"""Megatron's rules on how the parallel sizes split the model (arguments.py validate_args,
TransformerConfig, the parallel linears' `divide`): heads, key/value groups, vocabulary,
experts and MLP widths over tp, ep and etp. Pure: no I/O, no torch."""

from __future__ import annotations

from typing import Any

from ppsim.costs.arch import Architecture
from ppsim.costs.experts import expert_bias_refusal
from ppsim.costs.kinds import mtp_kinds, piece_kinds
from ppsim.costs.kv_split import kv_split_problem, qkv_width_problem
from ppsim.costs.layerops import vocab_split_problem
from ppsim.costs.stack import layer_kinds
from ppsim.errors import UserError


def parallel_shape(raw: dict[str, Any]) -> None:
    """The splits Megatron asserts (arguments.py): tp divides the attention heads and a
    vocabulary it does not pad, and divides the key/value groups or is a multiple of them
    (ppsim.costs.kv_split), the groups divide the heads, ep > 1 has routed experts and
    divides them, etp (tp by default) divides an expert's width, and a token is routed to
    no more experts than there are."""
    def get(key: str, default: int) -> int:
        value = raw.get(key, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    _attention(raw, get)
    _sequence_parallel(raw, get("tp", 1), get("num_experts", 0))
    _experts(get)
    _expert_biases(raw, get)


def _attention(raw: dict[str, Any], get: Any) -> None:
    tp, heads, groups = get("tp", 1), get("num_heads", 1), get("num_kv_heads", 1)
    if heads % tp:
        raise UserError("model.tp", f"{tp:,} does not divide num_heads = {heads:,}",
                        "use a tensor-parallel size that divides the heads (Megatron asserts "
                        "num_attention_heads % tp == 0)")
    hidden = get("hidden_size", heads)
    if not get("head_dim", 0) and hidden % heads:
        raise UserError("model.hidden_size", f"{hidden:,} is not divisible by num_heads = "
                        f"{heads:,}, which Megatron asserts when --kv-channels is not given",
                        "give head_dim (--kv-channels), or a hidden size the heads divide")
    vocab = vocab_split_problem(get("vocab_size", tp), raw.get("pad_vocab", True) is not False,
                                tp)
    if vocab:
        raise UserError("model.vocab_size", f"{vocab} (tp), as Megatron asserts for a "
                        "vocabulary taken as it is (--padded-vocab-size, pad_vocab = false)",
                        "give a size tp divides, or --vocab-size for Megatron to pad it")
    if raw.get("attention", "gqa") != "mla":
        if heads % groups:
            raise UserError("model.num_kv_heads", f"{groups:,} key/value heads do not divide "
                            f"num_heads = {heads:,}", "give a divisor of num_heads")
        problem = kv_split_problem(groups, tp)
        if problem:
            raise UserError("model.tp", f"{tp:,} does not divide num_kv_heads = {groups:,} "
                            f"({problem}, in Megatron's words)", "use a tensor-parallel size "
                            "that divides the key/value heads, or a multiple of them")
        problem = qkv_width_problem(heads, groups, get("head_dim", 0) or hidden // heads,
                                    raw.get("attention_output_gate") is True, tp)
        if problem:
            raise UserError("model.head_dim", problem, "choose a head_dim (--kv-channels) or "
                            "a tp that divides them")


def _sequence_parallel(raw: dict[str, Any], tp: int, experts: int) -> None:
    torchtitan = raw.get("fsdp") is True and raw.get("fsdp_framework", "torchtitan") == "torchtitan"
    if torchtitan and tp > 1 and raw.get("sequence_parallel") is False:
        raise UserError("model.sequence_parallel", "torchtitan's tensor parallelism always "
                        "splits the norms by tokens (SequenceParallel in its TP plan)",
                        "drop sequence_parallel = false, or --no-sequence-parallel")
    if experts and tp > 1 and raw.get("sequence_parallel") is False:
        raise UserError("model.sequence_parallel", "During training, performance may degrade "
                        "if MoE and tensor parallelism are enabled without also enabling "
                        "sequence parallelism (Megatron's MoELayer refuses to train so)",
                        "add --sequence-parallel, or set model.sequence_parallel = true")


def _experts(get: Any) -> None:
    tp, experts, top_k, ep = get("tp", 1), get("num_experts", 0), get("top_k", 0), get("ep", 1)
    if experts and top_k > experts:
        raise UserError("model.top_k", f"routes each token to {top_k:,} experts of "
                        f"num_experts = {experts:,}", f"use top_k <= {experts:,}")
    if ep > 1 and not experts:
        raise UserError("model.ep", f"{ep:,} with no routed experts (num_experts is not set)",
                        "use ep = 1 for a dense model (Megatron asserts num_experts is set "
                        "to use expert model parallelism)")
    if experts and experts % ep:
        raise UserError("model.ep", f"{ep:,} does not divide num_experts = {experts:,}",
                        "use an expert-parallel size that divides the experts")
    etp, ffn = get("etp", 0) or tp, get("moe_ffn_hidden_size", 0)
    if experts and ffn % etp:
        raise UserError("model.etp" if get("etp", 0) else "model.tp",
                        f"{etp:,} does not divide moe_ffn_hidden_size = {ffn:,}: each expert's "
                        "units split over the expert tensor-parallel ranks",
                        "give an expert tensor-parallel size (--expert-tensor-parallel-size) "
                        "that divides the experts' width")


def _expert_biases(raw: dict[str, Any], get: Any) -> None:
    """Biased linears (Megatron's default) in an MoE model: only at etp 1, and with no
    shared experts (SharedExpertMLP asserts add_bias_linear is False)."""
    if raw.get("linear_bias") is not True:
        return
    etp = get("etp", 0) or get("tp", 1)
    refusal = expert_bias_refusal(True, get("num_experts", 0), etp)
    if refusal:
        raise UserError("model.etp" if get("etp", 0) else "model.tp", f"routed experts "
                        f"with biases split over etp {etp}: {refusal} (Megatron's words)",
                        "add --disable-bias-linear (linear_bias = false), or give "
                        "--expert-tensor-parallel-size 1 (etp = 1)")
    shared = get("shared_expert_ffn_hidden_size", 0) or get("shared_experts", 0)
    if get("num_experts", 0) and shared:
        raise UserError("model.linear_bias", "bias is not supported in the shared experts "
                        "(Megatron's words)", "add --disable-bias-linear (linear_bias = "
                        "false), or drop the shared experts")


def built(a: Architecture) -> None:
    """Megatron's rules on what the fields build: MTP beside rotary or no positions
    (arguments.py validate_args), and the MLPs' widths over tp (_mlp_split)."""
    if a.mtp_layers and a.learned_positions:
        raise UserError("model.mtp_layers", "Multi-Token Prediction (MTP) is not supported "
                        "with learned_absolute position embedding type (Megatron's words)",
                        "use rotary positions (--position-embedding-type rope), or drop "
                        "--mtp-num-layers")
    _mlp_split(a)


def _mlp_split(a: Architecture) -> None:
    """tp divides the widths Megatron's MLPs split by columns over the tensor ranks
    (ColumnParallelLinear and RowParallelLinear `divide`, megatron/core/utils.py): a dense
    MLP's ffn_hidden_size, and the shared experts' width (SharedExpertMLP runs on the
    tensor-parallel group, not the expert one)."""
    pieces = {p for k in layer_kinds(a) + (mtp_kinds(a) if a.mtp_layers else ())
              for p in piece_kinds(a, k)}
    shared = a.shared_width if a.num_experts else 0
    shared_field = ("shared_expert_ffn_hidden_size" if a.shared_expert_ffn_hidden_size
                    else "shared_experts")
    for field, width, used in (("ffn_hidden_size", a.ffn_hidden_size,
                                bool(pieces & {"dense", "mlp"})),
                               (shared_field, shared, bool(pieces & {"moe", "moe-mlp"}))):
        if used and width % a.tp:
            raise UserError(f"model.{field}", f"{width:,} is not divisible by {a.tp} (tp), "
                            "as Megatron asserts for the "
                            + ("dense MLP's" if field == "ffn_hidden_size" else
                               "shared experts' MLP")
                            + " width split over the tensor ranks",
                            "use a tensor-parallel size that divides it")
