"""A model as Megatron's arguments reads back as the same model, for any architecture.

`ppsim presets NAME` prints a preset's arguments (ppsim.cli.megatron_args); this holds
the inverse for every valid architecture, not only the presets: dense or MoE layers in
any order, GQA (with query and key norms, an output gate, GatedDeltaNet in some layers,
or not) or MLA (sparse or not), either norm and position, tied or not, any precision, FP8 or not."""

from __future__ import annotations

import argparse

from helpers import arch_meaning, mla_fields
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import add_config_flags, config_from_args
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.model import parse_model
from ppsim.errors import UserError


@st.composite
def architectures(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    head_dim = draw(st.sampled_from([8, 16, 32]))
    layers = draw(st.integers(1, 8))
    fields = dict(
        num_layers=layers, hidden_size=heads * head_dim, num_heads=heads,
        num_kv_heads=draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0])),
        ffn_hidden_size=64 * draw(st.integers(1, 8)), vocab_size=draw(st.integers(50, 5000)),
        seq_length=64 * draw(st.integers(1, 8)), micro_batch_size=draw(st.integers(1, 4)),
        gated_mlp=draw(st.booleans()), dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        tie_embeddings=draw(st.booleans()), dropout=draw(st.booleans()),
        norm=draw(st.sampled_from(["", "layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["", "rotary", "learned", "none"])),
        head_dim=draw(st.sampled_from([0, head_dim, 2 * head_dim])),
        distributed_optimizer=draw(st.booleans()), mtp_layers=draw(st.integers(0, 1)),
        tp=draw(st.sampled_from([1, 2])))
    if fields["dtype"] == "bf16" and draw(st.booleans()):  # FP8 matmuls
        fields.update(fp8=draw(st.sampled_from(["e4m3", "hybrid"])),
                      fp8_recipe=draw(st.sampled_from(["delayed", "tensorwise", "blockwise"])),
                      fp8_param_gather=fields["distributed_optimizer"] and draw(st.booleans()))
        if fields["fp8_recipe"] != "delayed" and draw(st.booleans()):
            fields.update(first_last_layers_bf16=True,
                          num_layers_at_start_in_bf16=draw(st.integers(0, layers)),
                          num_layers_at_end_in_bf16=draw(st.integers(0, layers)))
    if draw(st.booleans()):  # MoE, in any order of kinds
        experts = draw(st.integers(2, 8))
        kinds = draw(st.lists(st.sampled_from(["dense", "moe"]), min_size=layers,
                              max_size=layers))
        fields.update(num_experts=experts, top_k=draw(st.integers(1, experts)),
                      moe_ffn_hidden_size=64 * draw(st.integers(1, 4)),
                      shared_experts=draw(st.integers(0, 2)),
                      layers=", ".join(kinds), ep=draw(st.sampled_from([1, 2])))
        assume(experts % fields["ep"] == 0)
        fields["shared_expert_gate"] = fields["shared_experts"] > 0 and draw(st.booleans())
    if draw(st.booleans()):  # MLA, with DeepSeek sparse attention or not
        fields.update(mla_fields(draw, heads))
        if draw(st.booleans()):
            fields.update(experimental_attention_variant="dsa",
                          dsa_indexer_n_heads=draw(st.sampled_from([4, 8])),
                          dsa_indexer_head_dim=draw(st.sampled_from([16, 32])),
                          dsa_indexer_topk=draw(st.integers(8, 128)))
    else:  # query and key norms, an output gate, GatedDeltaNet in some layers
        fields.update(qk_layernorm=draw(st.booleans()), attention_output_gate=draw(st.booleans()))
        freq = draw(st.sampled_from(["", "1", "2", "3"]))
        if freq:
            fields.update(experimental_attention_variant=draw(st.sampled_from(
                ["gdn", "gated_delta_net"])), linear_attention_freq=freq,
                linear_conv_kernel_dim=draw(st.integers(1, 6)))
    try:
        return parse_model({"kind": "transformer", **fields}).arch
    except UserError:
        assume(False)


PARSER = argparse.ArgumentParser()
add_config_flags(PARSER)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.filter_too_much])
@given(architectures())
def test_a_model_as_megatron_arguments_reads_back_as_the_same_model(arch) -> None:
    args = megatron_model_args(arch)
    back = config_from_args(PARSER.parse_args(args)).model.arch
    assert arch_meaning(back) == arch_meaning(arch), args


def test_a_top_one_router_reads_back() -> None:
    """Before: a top-1 MoE's arguments lacked --moe-router-pre-softmax, and Megatron (as
    ppsim) refuses top-k 1 under a softmax after the top-k."""
    arch = parse_model({"kind": "transformer", "num_layers": 2, "hidden_size": 64,
                        "num_heads": 4, "num_kv_heads": 4, "ffn_hidden_size": 256,
                        "vocab_size": 512, "seq_length": 64, "num_experts": 4, "top_k": 1,
                        "moe_ffn_hidden_size": 64}).arch
    args = megatron_model_args(arch)
    assert "--moe-router-pre-softmax" in args
    back = config_from_args(PARSER.parse_args(args)).model.arch
    assert arch_meaning(back) == arch_meaning(arch)
