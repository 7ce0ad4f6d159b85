"""Megatron's two FLOP formulas agree where they describe the same model: a hybrid
pattern of attention and MLP (or MoE) layers counts as the transformer of that many
layers (training.py's hybrid_flops against transformer_flops; they part only at MTP
modules, whose norms and projection the hybrid count leaves out). And a gated MLP counts
its third matrix under --swiglu alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.model import parse_model
from ppsim.job.flops import iteration_flops

SHAPES = st.fixed_dictionaries({
    "layers": st.integers(1, 6),
    "heads": st.sampled_from([4, 8, 16]),
    "groups": st.sampled_from([1, 2, 4]),
    "head_dim": st.sampled_from([32, 64, 128]),
    "hidden": st.sampled_from([256, 512, 1024]),
    "ffn": st.integers(1, 64).map(lambda k: 64 * k),
    "vocab": st.integers(1000, 50000),
    "seq": st.sampled_from([128, 1024, 4096]),
    "tp": st.sampled_from([1, 2, 4]),
    "gated": st.booleans(),
    "activation": st.sampled_from(["swiglu", "quick_geglu"]),
    "moe": st.booleans(),
    "top_k": st.integers(1, 4),
    "latent": st.sampled_from([0, 128]),
    "batch": st.integers(1, 8),
})


def _model(d: dict, hybrid: bool):
    fields = {"kind": "transformer", "hidden_size": d["hidden"], "num_heads": d["heads"],
              "num_kv_heads": max(d["groups"], d["tp"]), "head_dim": d["head_dim"],
              "ffn_hidden_size": d["ffn"], "vocab_size": d["vocab"], "seq_length": d["seq"],
              "tp": d["tp"], "gated_mlp": d["gated"], "gated_activation": d["activation"]}
    if d["moe"]:
        fields.update(num_experts=8, top_k=d["top_k"], moe_ffn_hidden_size=d["ffn"],
                      shared_experts=1, moe_latent_size=d["latent"])
    if hybrid:
        fields.update(hybrid_layer_pattern=("*E" if d["moe"] else "*-") * d["layers"],
                      num_layers=2 * d["layers"])
    else:
        fields["num_layers"] = d["layers"]
    return parse_model(fields).arch  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(SHAPES)
def test_a_hybrid_of_attention_and_mlp_counts_as_the_transformer(d: dict) -> None:
    hybrid, plain = _model(d, hybrid=True), _model(d, hybrid=False)
    for causal in (True, False):
        assert iteration_flops(hybrid, d["batch"], causal) == pytest.approx(
            iteration_flops(plain, d["batch"], causal), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(SHAPES)
def test_only_swiglu_counts_a_third_matrix(d: dict) -> None:
    d = {**d, "gated": True}
    swiglu = _model({**d, "activation": "swiglu"}, hybrid=False)
    geglu = _model({**d, "activation": "quick_geglu"}, hybrid=False)
    gelu = _model({**d, "gated": False}, hybrid=False)
    assert iteration_flops(geglu, d["batch"]) == pytest.approx(iteration_flops(gelu, d["batch"]),
                                                               rel=1e-12)
    assert iteration_flops(swiglu, d["batch"]) > iteration_flops(geglu, d["batch"])
