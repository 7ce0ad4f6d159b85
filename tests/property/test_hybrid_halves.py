"""A hybrid stack's attention layer and MLP (or MoE) layer are the two halves of a
decoder layer (Megatron builds each as a TransformerLayer with the other half empty):
under any recompute and offload modules, the pair keeps, offloads and repeats what one
decoder layer does (ppsim.costs.saved.HYBRID_HALVES)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.model import parse_model
from ppsim.config.schema import config_from_dict
from ppsim.costs.kinds import kind_effect
from ppsim.costs.modules import OFFLOAD_MODULES, RECOMPUTE_MODULES, module_effect
from ppsim.costs.transformer import accelerator, transformer_costs

MOE = parse_model({"preset": "mixtral-8x7b", "num_layers": 1}).arch  # type: ignore[union-attr]
DENSE = parse_model({"preset": "llama3-8b", "num_layers": 1}).arch  # type: ignore[union-attr]
ACC = accelerator(config_from_dict({"model": {"preset": "llama3-8b"},
                                     "hardware": {"preset": "h100-80gb"}}).hardware)


@st.composite
def archs(draw):
    moe = draw(st.booleans())
    a = MOE if moe else DENSE
    a = replace(a, tp=draw(st.sampled_from([1, 2, 4])), dropout=draw(st.booleans()),
                fp8=draw(st.sampled_from(["", "hybrid"])), micro_batch_size=1,
                seq_length=draw(st.sampled_from([1024, 4096])))
    return a, ("moe" if moe else "dense")


modules = st.lists(st.sampled_from(RECOMPUTE_MODULES), max_size=4, unique=True).map(tuple)
offloads = st.lists(st.sampled_from(OFFLOAD_MODULES), max_size=4, unique=True).map(tuple)


@settings(max_examples=150, deadline=None)
@given(archs(), modules, offloads, st.booleans())
def test_an_attention_and_an_mlp_layer_keep_what_one_decoder_layer_does(arch, rec, off, full):
    a, kind = arch
    half = "moe-mlp" if kind == "moe" else "mlp"
    whole = module_effect(a, kind, rec, off, full)
    pair = [kind_effect(a, k, rec, off, full) for k in ("attention", half)]
    if full:  # each layer keeps its input: the decoder layer's, and the residual after
        # attention, which the decoder layer keeps as its second norm's input anyway
        assert pair[0].kept_bytes == whole.kept_bytes
        return
    assert abs(sum(p.kept_bytes for p in pair) - whole.kept_bytes) <= 2
    assert abs(sum(p.offloaded_bytes for p in pair) - whole.offloaded_bytes) <= 2
    assert abs(sum(p.freed_bytes for p in pair) - whole.freed_bytes) <= 2
    norms = {"norm1", "norm2"}
    repeated = {("norm" if op in norms else op) for op in whole.repeated_ops}
    assert pair[0].repeated_ops | pair[1].repeated_ops == repeated


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(), ("core_attn",), ("layernorm",), ("mlp",), ("core_attn", "mlp"),
                        ("moe_act", "layernorm"), ("moe",)]), st.booleans(),
       st.sampled_from(["", "hybrid"]))
def test_a_hybrid_pair_takes_a_decoder_layers_time(rec, moe, fp8):
    """Same ops, so the same forward; the recomputed modules' forward ops once more in
    the backward (selective recompute on a hybrid stack's attention layers included);
    under FP8 the same TE linears in FP8."""
    base = replace(MOE if moe else DENSE, fp8=fp8)
    layer = transformer_costs(base, ACC, rec).layers[0]
    hybrid = replace(base, hybrid_layer_pattern="*E" if moe else "*-", num_layers=2)
    pair = transformer_costs(hybrid, ACC, rec).layers
    assert sum(c.forward_ms for c in pair) == pytest.approx(layer.forward_ms, rel=1e-9)
    assert sum(c.backward_ms for c in pair) == pytest.approx(layer.backward_ms, rel=1e-9)
    assert sum(c.activation_bytes for c in pair) == pytest.approx(layer.activation_bytes,
                                                                  abs=2)


def test_selective_recompute_repeats_a_hybrid_attention_layers_core() -> None:
    hybrid = parse_model({"preset": "nemotron-h-8b"}).arch  # type: ignore[union-attr]
    kinds = transformer_costs(hybrid, ACC).kinds
    at = kinds.index("attention")
    plain = transformer_costs(replace(hybrid, recompute="none"), ACC).layers[at]
    selective = transformer_costs(replace(hybrid, recompute="selective"), ACC).layers[at]
    assert selective.forward_ms == plain.forward_ms
    assert selective.backward_ms > plain.backward_ms
    assert selective.activation_bytes < plain.activation_bytes
