"""The hybrid kinds' costs (ppsim.costs.mixers) and their plain-torch reference mixers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.model import parse_model
from ppsim.config.schema import hardware_config
from ppsim.costs.arch import Architecture
from ppsim.costs.mixers import (
    MIXER_KINDS,
    mamba_shape,
    mixer_activation_bytes,
    mixer_ops,
    mixer_params,
)
from ppsim.costs.params import kind_params
from ppsim.costs.transformer import accelerator, transformer_costs

torch = pytest.importorskip("torch")

from ppsim.executor.builders.hybrid import build  # noqa: E402
from ppsim.executor.builders.ssm import (  # noqa: E402
    delta_chunked,
    delta_recurrent,
    ssd_chunked,
    ssd_recurrent,
)

NEMO = parse_model({"preset": "nemotron-h-8b"}).arch  # type: ignore[union-attr]
MLA = dict(q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16, v_head_dim=32, head_dim=32)


def _arch(**kw) -> Architecture:
    base = dict(num_layers=1, hidden_size=256, num_heads=8, num_kv_heads=2,
                ffn_hidden_size=512, vocab_size=1000, seq_length=1024, num_experts=8, top_k=2,
                moe_ffn_hidden_size=128, mamba_head_dim=32, mamba_num_groups=2,
                mamba_state_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=32, linear_value_head_dim=32, dsa_indexer_topk=128, **MLA)
    return Architecture(**{**base, **kw})


def _flops(ops, name=None) -> float:
    return sum(op.flops for op in ops if name is None or op.name == name)


# --- Parameters ------------------------------------------------------------------------------


def test_mamba_and_gdn_params_follow_megatrons_shapes():
    a, h = NEMO, NEMO.hidden_size
    # MambaMixer: in_proj h -> 2 d_inner + 2 groups state + heads; conv over d_inner +
    # 2 groups state (kernel 4, bias); dt_bias, A_log, D; the gated norm; out_proj.
    d_inner, bc, heads = 128 * 64, 2 * 8 * 128, 128
    want = (h * (2 * d_inner + bc + heads) + (d_inner + bc) * 5 + 3 * heads + d_inner
            + d_inner * h + h)
    assert mixer_params(a, "mamba").dense == want
    q = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]
    key, value, hv = 16 * 128, 32 * 128, 32
    # GatedDeltaNet: in_proj to q, k, v, z, beta, alpha; conv (no bias) over q, k, v;
    # dt_bias, A_log; a per-head gated norm; out_proj; the pre-norm.
    want = (q.hidden_size * (2 * key + 2 * value + 2 * hv) + (2 * key + value) * 4 + 2 * hv
            + 128 + value * q.hidden_size + q.hidden_size)
    assert mixer_params(q, "gdn").dense == want


def test_attention_and_moe_alone_add_up_to_a_transformer_moe_layer():
    a = _arch(shared_experts=1)
    whole = kind_params(a, "moe")
    attn, moe = mixer_params(a, "attention"), mixer_params(a, "moe-mlp")
    assert attn.dense + moe.dense == whole.dense and moe.experts == whole.experts
    assert attn.active + moe.active == whole.active


@pytest.mark.parametrize("preset_change", [{}, {"gated_mlp": True, "shared_experts": 1},
                                           {"norm": "layernorm", "mamba_num_groups": 4}])
def test_torch_mixers_hold_the_parameters_the_cost_model_counts(preset_change):
    m = parse_model({"preset": "tiny-hybrid", **preset_change})
    builder = build(m.fields())
    for i in range(builder.num_layers):
        kind = builder.layer_kind(i)
        held = sum(p.numel() for p in builder.layer(i).parameters())
        want = mixer_params(m.arch, kind)  # type: ignore[union-attr]
        assert held == want.dense + want.experts, kind


# --- Ops and activations -------------------------------------------------------------------


@pytest.mark.parametrize("kind", MIXER_KINDS)
def test_every_kind_has_a_norm_a_residual_and_work(kind):
    ops = mixer_ops(_arch(), kind)
    assert ops[0].name == "norm" and ops[-1].name == "residual"
    assert _flops(ops) > 0 and all(op.flops >= 0 and op.nbytes >= 0 for op in ops)
    held = mixer_params(_arch(), kind)  # the matmuls' weights are some of what a rank holds
    assert 0 < sum(op.params for op in ops) <= held.dense + held.experts


def test_scans_grow_linearly_with_the_sequence_attention_quadratically():
    short, long = _arch(seq_length=1024), _arch(seq_length=4096)
    for kind, core in (("mamba", "mamba.ssd_scan"), ("gdn", "gdn.delta_rule")):
        assert _flops(mixer_ops(long, kind), core) == pytest.approx(
            4 * _flops(mixer_ops(short, kind), core))
    att = [_flops(mixer_ops(a, "attention"), "attention") for a in (short, long)]
    assert att[1] == pytest.approx(16 * att[0])
    # DSA: each query attends to at most top-k keys, so far beyond top-k the core is linear.
    dsa = [_flops(mixer_ops(a, "dsa"), "attention") for a in (short, long)]
    assert dsa[1] == pytest.approx(4 * dsa[0], rel=0.05)
    assert dsa[1] < _flops(mixer_ops(long, "mla"), "attention") / 10


def test_the_ssd_scan_is_priced_as_a_fused_kernel():
    scan = next(op for op in mixer_ops(NEMO, "mamba") if op.name == "mamba.ssd_scan")
    assert scan.attention and scan.params == 0


@pytest.mark.parametrize("kind", MIXER_KINDS)
def test_full_recompute_keeps_only_the_layer_input(kind):
    a = _arch(recompute="full", tp=2)
    assert mixer_activation_bytes(a, kind) == 1024 * 256 * 2 // 2


def test_mamba_keeps_more_than_attention_and_scales_with_tokens():
    a = _arch(recompute="selective")
    m1 = mixer_activation_bytes(a, "mamba")
    assert m1 > mixer_activation_bytes(a, "attention")
    assert mixer_activation_bytes(replace(a, seq_length=2048), "mamba") == pytest.approx(2 * m1,
                                                                                      rel=1e-6)
    assert mixer_activation_bytes(replace(a, tp=2), "mamba") == pytest.approx(m1 / 2, rel=1e-6)


def test_mamba_keeps_what_megatrons_memory_efficient_path_keeps():
    # Megatron trains a Mamba layer through mamba_ssm's mamba_split_conv1d_scan_combined
    # (megatron/core/ssm/mamba_mixer.py _ssm_training; use_mamba_mem_eff_path defaults to
    # True in transformer_config.py), whose autograd function saves zxbcdt and out_x and
    # recomputes the conv, dt and the chunk states in its backward; RMSNormGated then saves
    # its input and an fp32 rstd a group, out_proj its input. Before them: the pre-norm's
    # input and rstd and its output (in_proj's input).
    m, tok, h = mamba_shape(NEMO), NEMO.seq_length * NEMO.micro_batch_size, NEMO.hidden_size
    assert NEMO.dtype == "bf16" and not NEMO.dropout and NEMO.rmsnorm
    prenorm = tok * (h * 2 + 4) + tok * h * 2
    mixer = tok * ((m.in_proj + 3 * m.inner) * 2 + m.groups * 4)
    assert mixer_activation_bytes(NEMO, "mamba") == prenorm + mixer


def test_hybrid_costs_follow_the_pattern_and_price_mtp_depths():
    acc = accelerator(hardware_config({"preset": "h100-80gb"}))
    arch = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]
    costs = transformer_costs(arch, acc)
    assert costs.kinds[:8] == ("gdn", "moe-mlp") * 3 + ("attention", "moe-mlp")
    assert costs.num_layers == 97 and costs.mtp_layers == 1
    attn, moe, mtp = costs.layers[6], costs.layers[7], costs.layers[-1]
    # One depth runs its pattern ("*E"), its projection and the shared head.
    assert mtp.forward_ms > attn.forward_ms + moe.forward_ms + costs.head.forward_ms
    assert mtp.static_bytes > attn.static_bytes + moe.static_bytes


# --- The reference scans: chunked forms equal the token-by-token definitions ------------------


shapes = st.tuples(st.integers(1, 2), st.integers(1, 40), st.sampled_from([1, 2]),
                   st.integers(1, 3), st.integers(2, 6), st.sampled_from([4, 8, 16]))


@settings(max_examples=20, deadline=None)
@given(shapes, st.integers(0, 2 ** 16))
def test_chunked_ssd_equals_the_recurrence(shape, seed):
    b, s, groups, per_group, p, chunk = shape
    g = torch.Generator().manual_seed(seed)
    h, n = groups * per_group, 3
    x = torch.randn(b, s, h, p, generator=g, dtype=torch.float64)
    dt = torch.rand(b, s, h, generator=g, dtype=torch.float64)
    a = -torch.rand(h, generator=g, dtype=torch.float64) - 0.1
    bb, cc = (torch.randn(b, s, groups, n, generator=g, dtype=torch.float64) for _ in "BC")
    torch.testing.assert_close(ssd_chunked(x, dt, a, bb, cc, chunk),
                               ssd_recurrent(x, dt, a, bb, cc))


@settings(max_examples=20, deadline=None)
@given(shapes, st.integers(0, 2 ** 16))
def test_chunked_delta_rule_equals_the_recurrence(shape, seed):
    b, s, _, h, d, chunk = shape
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(b, s, h, d, generator=g,
                                                      dtype=torch.float64), dim=-1)
            for _ in "qk")
    v = torch.randn(b, s, h, d + 1, generator=g, dtype=torch.float64)
    decay = -torch.rand(b, s, h, generator=g, dtype=torch.float64)
    beta = torch.rand(b, s, h, generator=g, dtype=torch.float64)
    torch.testing.assert_close(delta_chunked(q, k, v, decay, beta, chunk),
                               delta_recurrent(q, k, v, decay, beta))


def test_the_hybrid_stack_trains_through_every_mixer():
    builder = build(parse_model({"preset": "tiny-hybrid"}).fields())
    layers = [builder.layer(i) for i in range(builder.num_layers)]
    ids, targets = builder.microbatch(0, 0, 0)
    x = builder.embedding()(ids)
    for layer in layers:
        x = layer(x)
    loss = builder.loss(builder.head()(x), targets)
    loss.backward()
    for layer in layers:
        assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.any()
                   for p in layer.parameters()), builder.layer_kind(layers.index(layer))


def test_a_bf16_hybrid_stack_runs_forward_and_backward_on_cpu():
    # torch has no bf16 triangular solve on CPU; the delta rule solves its chunk in fp32.
    builder = build(parse_model({"preset": "tiny-hybrid", "dtype": "bf16"}).fields())
    gdn = builder.layer(4).to(builder.dtype)
    x = torch.randn(builder.activation_shape, dtype=builder.dtype, requires_grad=True)
    out = gdn(x)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()


@pytest.mark.parametrize("change, field", [
    ({"mamba_head_dim": 0}, "model.mamba_head_dim"),
    ({"mamba_num_groups": 3}, "model.mamba_num_heads"),  # 16 heads in 3 groups
    ({"linear_num_key_heads": 0}, "model.linear_num_key_heads"),
    ({"linear_num_value_heads": 3}, "model.linear_num_value_heads"),  # 3 over 2 key heads
])
def test_shapes_megatron_cannot_build_exit_2_naming_the_field(change, field, tmp_path,
                                                              capsys):
    body = "\n".join(f"{k} = {v}" for k, v in change.items())
    cfg = tmp_path / "hybrid.toml"
    cfg.write_text(f'[model]\npreset = "tiny-hybrid"\n{body}\n')
    assert main(["simulate", "--config", str(cfg), "--pp", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
