"""FP8's invariants over any transformer layer: its TE linears scale by the peaks' ratio
and nothing else changes speed; no kept tensor grows, the one new tensor is the output
projection's FP8 copy; under any recompute and offload modules the layer keeps at most
what bf16 keeps plus that copy. Over any Mamba or GatedDeltaNet mixer: its in_proj and
out_proj alone change speed, and it keeps their inputs in one byte."""

from __future__ import annotations

from dataclasses import replace

from helpers import mla_fields
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ppsim.config.model import parse_model
from ppsim.costs.arch import Architecture
from ppsim.costs.attention_shape import attention_shape
from ppsim.costs.fp8 import PROJ_INPUT
from ppsim.costs.layerops import layer_ops
from ppsim.costs.mixers import mixer_activation_bytes, mixer_ops
from ppsim.costs.modules import OFFLOAD_MODULES, RECOMPUTE_MODULES, module_effect
from ppsim.costs.ops import Roofline, op_times
from ppsim.costs.saved import saved_tensors
from ppsim.errors import UserError


@st.composite
def layers(draw) -> tuple[Architecture, str]:
    heads = draw(st.sampled_from([2, 4, 8]))
    head_dim = draw(st.sampled_from([8, 16, 32]))
    fields = dict(num_layers=1, hidden_size=heads * head_dim, num_heads=heads,
                  num_kv_heads=draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0])),
                  ffn_hidden_size=64 * draw(st.integers(1, 8)), vocab_size=512,
                  seq_length=64 * draw(st.integers(1, 8)), micro_batch_size=draw(
                      st.integers(1, 4)), gated_mlp=draw(st.booleans()),
                  dropout=draw(st.booleans()), tp=draw(st.sampled_from([1, 2])),
                  head_dim=draw(st.sampled_from([0, 2 * head_dim])), dtype="bf16",
                  fp8=draw(st.sampled_from(["e4m3", "hybrid"])))
    kind = draw(st.sampled_from(["dense", "moe"]))
    if kind == "moe":
        experts = draw(st.sampled_from([2, 4, 8]))
        fields.update(num_experts=experts, top_k=draw(st.integers(1, experts)),
                      moe_ffn_hidden_size=64 * draw(st.integers(1, 4)),
                      shared_experts=draw(st.integers(0, 1)),
                      moe_latent_size=draw(st.sampled_from([0, 32])))
    if draw(st.booleans()):
        fields.update(mla_fields(draw, heads))
    try:
        return parse_model({"kind": "transformer", **fields}).arch, kind
    except UserError:
        assume(False)
        raise


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(layers(), st.floats(100.0, 2000.0), st.floats(1.5, 3.0), st.floats(0.5, 1.5))
def test_only_the_te_linears_change_speed_by_the_peaks_and_efficiencies_ratio(
        layer, peak: float, ratio: float, share: float) -> None:
    """An FP8 GEMM takes bf16's time x peak / (FP8 peak x fp8_efficiency_ratio)."""
    a, kind = layer
    roof = Roofline(peak_tflops=peak, fp8_peak_tflops=peak * ratio,
                    matmul_efficiency=((0.01, 0.2), (100.0, 0.8)), fp8_efficiency_ratio=share)
    for f8, bf in zip(layer_ops(a, kind), layer_ops(replace(a, fp8=""), kind), strict=True):
        scale = 1 / (ratio * share) if f8.fp8 else 1.0
        assert f8.fp8 == (bf.params > 0 and bf.name != "router")
        got, base = op_times(roof, f8)[:3], op_times(roof, bf)[:3]
        for g, b in zip(got, base, strict=True):
            assert abs(g - b * scale) <= 1e-9 * max(b, 1e-12)


@SETTINGS
@given(layers())
def test_no_kept_tensor_grows_and_the_one_new_is_the_projections_copy(layer) -> None:
    a, kind = layer
    f8, bf = saved_tensors(a, kind), saved_tensors(replace(a, fp8=""), kind)
    assert set(f8) == set(bf) | {PROJ_INPUT}
    assert all(f8[n] <= bf[n] for n in bf)
    tokens = a.seq_length * a.micro_batch_size
    assert f8[PROJ_INPUT] == tokens * attention_shape(a).out / a.tp


@SETTINGS
@given(layers(), st.sets(st.sampled_from(RECOMPUTE_MODULES)),
       st.sets(st.sampled_from(OFFLOAD_MODULES)))
def test_under_any_modules_fp8_keeps_at_most_bf16s_plus_the_copy(
        layer, recompute: set[str], offload: set[str]) -> None:
    a, kind = layer
    rec, off = tuple(sorted(recompute)), tuple(sorted(offload))
    f8 = module_effect(a, kind, rec, off)
    bf = module_effect(replace(a, fp8=""), kind, rec, off)
    copy = saved_tensors(a, kind)[PROJ_INPUT]
    assert f8.kept_bytes <= bf.kept_bytes + copy + 1
    assert f8.freed_bytes <= f8.offloaded_bytes
    assert f8.repeated_ops == bf.repeated_ops


@st.composite
def mixers(draw) -> tuple[Architecture, str]:
    """A Mamba-2 or GatedDeltaNet layer whose in_proj FP8 can run (its width a multiple
    of 16, as Megatron asserts)."""
    kind = draw(st.sampled_from(["mamba", "gdn"]))
    groups = draw(st.sampled_from([1, 2, 4]))
    fields = dict(num_layers=1, hidden_size=64 * draw(st.integers(1, 4)), num_heads=4,
                  num_kv_heads=4, ffn_hidden_size=128, vocab_size=512,
                  seq_length=128 * draw(st.integers(1, 4)),
                  micro_batch_size=draw(st.integers(1, 2)), tp=draw(st.sampled_from([1, 2])),
                  dtype="bf16", fp8=draw(st.sampled_from(["e4m3", "hybrid"])),
                  dropout=draw(st.booleans()),
                  mamba_num_heads=groups * draw(st.integers(1, 8)) * 2,
                  mamba_head_dim=draw(st.sampled_from([8, 16, 32])), mamba_num_groups=groups,
                  mamba_state_dim=draw(st.sampled_from([8, 16, 64])),
                  linear_num_key_heads=groups, linear_num_value_heads=groups * draw(
                      st.integers(1, 4)) * 2,
                  linear_key_head_dim=draw(st.sampled_from([8, 16, 32])),
                  linear_value_head_dim=draw(st.sampled_from([8, 16, 32])),
                  hybrid_layer_pattern="M" if kind == "mamba" else "G", norm="rmsnorm")
    try:
        a = parse_model({"kind": "transformer", **fields}).arch
        mixer_ops(a, kind)  # refuses an in_proj FP8 cannot run (Megatron's assertion)
    except UserError:
        assume(False)
        raise
    return a, kind


@SETTINGS
@given(mixers(), st.floats(1.5, 3.0))
def test_a_mixers_projections_alone_change_and_keep_their_inputs_in_one_byte(
        mixer, ratio: float) -> None:
    """in_proj and out_proj take bf16's time x peak / FP8 peak; the conv, the scan and the
    norms do not change; what the layer keeps falls by their inputs' second byte."""
    a, kind = mixer
    roof = Roofline(peak_tflops=500.0, fp8_peak_tflops=500.0 * ratio,
                    matmul_efficiency=((0.01, 0.2), (100.0, 0.8)))
    linears = {f"{kind}.in_proj", f"{kind}.out_proj"}
    for f8, bf in zip(mixer_ops(a, kind), mixer_ops(replace(a, fp8=""), kind), strict=True):
        assert f8.fp8 == (f8.name in linears)
        scale = 1 / ratio if f8.fp8 else 1.0
        for g, b in zip(op_times(roof, f8)[:3], op_times(roof, bf)[:3], strict=True):
            assert abs(g - b * scale) <= 1e-9 * max(b, 1e-12)
    out_in = (a.mamba_num_heads * a.mamba_head_dim if kind == "mamba"
              else a.linear_num_value_heads * a.linear_value_head_dim)
    tokens = a.seq_length * a.micro_batch_size
    saved = mixer_activation_bytes(replace(a, fp8=""), kind) - mixer_activation_bytes(a, kind)
    assert abs(saved - tokens * (a.hidden_size + out_in) / a.tp) <= 1
