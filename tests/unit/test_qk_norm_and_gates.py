"""Query and key norms (Megatron --qk-layernorm; Qwen3, OLMo 2), attention's output gate
(--attention-output-gate) and the shared experts' gate (--moe-shared-expert-gate), both
Qwen3-Next's.

ppsim took --qk-layernorm silently and priced no norm: no time, no kept input, no weight;
it refused the two gates as unknown arguments, so no Qwen3-Next launch line could be
pasted, and its preset had none of the three."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from helpers import kept_under_policy
from helpers import run_main as _run
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.config.model import parse_model
from ppsim.config.schema import load_config
from ppsim.costs.arch import Architecture
from ppsim.costs.kinds import model_params
from ppsim.costs.layerops import attention_ops
from ppsim.costs.modules import kept_tensors, module_effect
from ppsim.costs.params import kind_params
from ppsim.executor.builders.llama import architecture
from ppsim.job.flops import iteration_flops
from ppsim.policy.model import StagePolicy


def _arch(**more) -> Architecture:
    base = dict(num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=2,
                ffn_hidden_size=512, vocab_size=1024, seq_length=128, micro_batch_size=2,
                tp=2, dtype="bf16", dropout=False)
    return Architecture(**{**base, **more})


def _parsed(line: str) -> Architecture:
    return config_from_args(build_parser().parse_args(["simulate", *shlex.split(line)])).model.arch


@settings(max_examples=60, deadline=None)
@given(heads=st.sampled_from([4, 8, 16]), groups=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([16, 32, 64]), s=st.sampled_from([16, 64, 96]),
       b=st.integers(1, 3), tp=st.sampled_from([1, 2, 4]), rms=st.booleans(),
       qk=st.booleans(), gate=st.booleans(), kind=st.sampled_from(["dense", "moe"]))
def test_what_they_keep_is_their_closed_form(heads, groups, head_dim, s, b, tp, rms, qk, gate,
                                             kind) -> None:
    """Per tp rank: the norms keep q and k (2 bytes an element) and one fp32 statistic a
    head and token (LayerNorm: two); the gate keeps the gate and the gated output, each
    q wide."""
    assume(heads % groups == 0 and groups % tp == 0)
    a = _arch(num_heads=heads, num_kv_heads=groups, head_dim=head_dim, seq_length=s,
              micro_batch_size=b, tp=tp, norm="rmsnorm" if rms else "layernorm",
              num_experts=4, top_k=2, moe_ffn_hidden_size=64, layers=f"{kind}*2",
              qk_layernorm=qk, attention_output_gate=gate)
    plain = replace(a, qk_layernorm=False, attention_output_gate=False)
    tok, q, k = s * b, heads * head_dim, groups * head_dim
    norms = tok * (q + k) * 2 + tok * (heads + groups) * (4 if rms else 8)
    want = (norms * qk + tok * 2 * q * 2 * gate) / tp
    got = sum(kept_tensors(a, kind).values()) - sum(kept_tensors(plain, kind).values())
    assert got == pytest.approx(want)


def test_their_ops_widen_the_projection_and_add_three_passes() -> None:
    """8 heads of 32, 2 groups, b 2 x s 128, tp 2: the projection makes 256 more columns
    (the gate); the norms read and write q and k; the gate reads the output and the gate,
    writes the product, and its backward moves five such tensors."""
    a = _arch(qk_layernorm=True, attention_output_gate=True)
    ops = {op.name: op for op in attention_ops(a)}
    plain = {op.name: op for op in attention_ops(_arch())}
    tok = 256
    assert ops["qkv"].flops - plain["qkv"].flops == 2 * tok * 256 * 256 / 2
    assert ops["qk_norm"].nbytes == 2 * tok * (256 + 64) * 2 / 2
    assert ops["output_gate"].nbytes == tok * 3 * 256 * 2 / 2
    assert ops["output_gate"].backward_bytes == tok * 5 * 256 * 2 / 2
    assert "qk_norm" not in plain and "output_gate" not in plain
    assert list(ops).index("qk_norm") < list(ops).index("rotary")


@pytest.mark.parametrize("modules, moved", [
    (("qkv_linear",), ("norm1.out", "qk_norm.in", "qk_norm.stats")),
    (("attn_proj",), ("attn.gated",)),
])
def test_megatrons_offload_groups_take_them(modules, moved) -> None:
    """The norms run inside get_query_key_value_tensors, under the qkv_linear offload
    context; the projection's input is the gated output."""
    a = _arch(qk_layernorm=True, attention_output_gate=True)
    kept = kept_tensors(a, "dense")
    effect = module_effect(a, "dense", offload=modules)
    assert effect.offloaded_bytes == pytest.approx(sum(kept[n] for n in moved))


def test_the_gate_keeps_attentions_output_whatever_else_offloads_or_recomputes() -> None:
    a = _arch(attention_output_gate=True)
    out = kept_tensors(a, "dense")["attn.out"]
    assert module_effect(a, "dense", offload=("core_attn",)).freed_bytes == pytest.approx(
        module_effect(a, "dense", offload=("core_attn",)).offloaded_bytes - out)
    fp8 = replace(a, fp8="hybrid", fp8_recipe="tensorwise")
    assert "attn.out" in kept_tensors(fp8, "dense", ("core_attn",))
    assert "attn.out" not in kept_tensors(replace(fp8, attention_output_gate=False), "dense",
                                          ("core_attn",))
    assert "attn.gated" not in kept_tensors(fp8, "dense")  # its FP8 copy is the input kept


GPT = load_config(None).model.fields()
LLAMA = {**GPT, "gated_mlp": True, "norm": "rmsnorm", "position": "rotary", "num_kv_heads": 2,
         "ffn_hidden_size": 176, "layers": "dense*8", "dtype": "bf16"}
POLICIES = [StagePolicy(), StagePolicy(recompute_modules=("core_attn",)),
            StagePolicy(offload_modules=("qkv_linear", "attn_proj"), offload_fraction=1.0),
            StagePolicy(offload_modules=("core_attn",), offload_fraction=1.0)]


HYBRID = parse_model({"preset": "tiny-hybrid"}).fields()


@pytest.mark.parametrize("fields, layer, kind", [(GPT, 0, "dense"), (LLAMA, 0, "dense"),
                                                 (HYBRID, 2, "attention")],
                         ids=["layernorm", "rmsnorm-gqa", "hybrid-attention"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.label())
def test_the_executor_keeps_what_the_model_counts(fields: dict, layer: int, kind: str,
                                                  policy: StagePolicy) -> None:
    """The executor's layer with both (a hybrid stack's attention layer too), its saved
    tensors counted as autograd keeps them, what its offloads move counted too."""
    fields = {**fields, "qk_layernorm": True, "attention_output_gate": True}
    kept, moved = kept_under_policy(fields, layer, policy)
    want = module_effect(architecture(fields), kind, policy.recompute_modules,
                         policy.offload_modules)
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)
    assert abs(moved - want.offloaded_bytes) <= 0.02 * max(want.offloaded_bytes, 1), (
        moved, want)


def test_the_executors_gate_has_the_gradient_of_its_formula() -> None:
    torch = pytest.importorskip("torch")
    from ppsim.executor.builders.llama import OutputGate

    g = torch.Generator().manual_seed(0)
    x, gate = (torch.randn(3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(2))
    assert torch.autograd.gradcheck(OutputGate.apply, (x, gate))
    torch.testing.assert_close(OutputGate.apply(x, gate), x * torch.sigmoid(gate))


def test_the_flags_set_them_and_presets_print_them() -> None:
    from ppsim.cli.megatron_args import megatron_model_args

    a = _parsed("--preset llama3-8b --qk-layernorm --attention-output-gate")
    assert a.qk_layernorm and a.attention_output_gate
    assert not _parsed("--preset llama3-8b").qk_layernorm
    assert _parsed("--preset llama3-8b --qk-l2-norm").qk_layernorm  # L2Norm: the same passes
    line = " ".join(megatron_model_args(parse_model({"preset": "qwen3-next-80b-a3b"}).arch))
    assert "--qk-layernorm" in line and "--attention-output-gate" in line
    assert "--qk-layernorm" in " ".join(megatron_model_args(
        parse_model({"preset": "qwen3-30b-a3b"}).arch))


def test_qk_layernorm_costs_time_and_memory_where_it_was_free() -> None:
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
            "--json"]
    plain = json.loads(_run(base)[1])
    normed = json.loads(_run([*base, "--qk-layernorm"])[1])
    assert normed["iteration_time_ms"] > plain["iteration_time_ms"]
    assert max(r["peak_memory_bytes"] for r in normed["ranks"]) > \
        max(r["peak_memory_bytes"] for r in plain["ranks"])


def test_the_gate_on_mla_is_refused_in_megatrons_words() -> None:
    code, out, err = _run(["simulate", "--preset", "deepseek-v3", "--hardware", "h100-80gb",
                           "--attention-output-gate"])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Output gate is not supported for MLA yet." in lines[0]


def test_megatron_counts_the_gates_projection_in_a_transformer_not_a_hybrid() -> None:
    """training.py's transformer_flops adds gate_projection_size (= q) to the QKV term:
    6 h q FLOPs a token a layer; hybrid_flops counts no gate."""
    a = _arch(num_layers=4, vocab_size=1024)
    h, q, tokens = 256, 256, 16 * 128
    gated = replace(a, attention_output_gate=True)
    assert iteration_flops(gated, 16) - iteration_flops(a, 16) == pytest.approx(
        6 * h * q * tokens * 4)
    hybrid = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]
    assert iteration_flops(hybrid, 8) == pytest.approx(
        iteration_flops(replace(hybrid, attention_output_gate=False), 8))


def test_qwen3_next_counts_its_gate_and_norm_weights() -> None:
    """12 attention layers, each a 2048 x 16 x 256 gate and two norms of 256."""
    a = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]
    plain = replace(a, attention_output_gate=False, qk_layernorm=False)
    assert model_params(a).total - model_params(plain).total == 12 * (2048 * 16 * 256 + 2 * 256)


def test_a_cost_file_measured_without_them_is_refused_with_them() -> None:
    from types import SimpleNamespace

    from ppsim.costs.costfile import check_model
    from ppsim.errors import UserError

    fields = {"kind": "transformer", **{k: v for k, v in GPT.items() if k != "kind"}}
    measured = SimpleNamespace(model=fields, path="costs.json")
    for key in ("qk_layernorm", "attention_output_gate"):
        with pytest.raises(UserError, match=key):
            check_model(measured, {**fields, key: True})


# ------------------------------------------------------------------ the shared experts' gate


def _moe(**more) -> Architecture:
    return _arch(num_experts=4, top_k=2, moe_ffn_hidden_size=64, shared_experts=1,
                 layers="moe*2", shared_expert_gate=True, **more)


@settings(max_examples=40, deadline=None)
@given(h=st.sampled_from([64, 128, 256]), s=st.sampled_from([16, 64]), b=st.integers(1, 3),
       tp=st.sampled_from([1, 2, 4]), shared=st.integers(0, 2))
def test_the_shared_experts_gate_keeps_their_output_and_its_score(h, s, b, tp, shared) -> None:
    """Per tp rank: the shared experts' h-wide output and a 2-byte score a token; nothing
    without shared experts, which Megatron then does not build; one more weight of h,
    whole on every tp rank; `shared_experts` and `moe` recompute drop both."""
    a = replace(_moe(hidden_size=h, num_heads=4, num_kv_heads=4, seq_length=s,
                     micro_batch_size=b, tp=tp), shared_experts=shared)
    plain = replace(a, shared_expert_gate=False)
    got = sum(kept_tensors(a, "moe").values()) - sum(kept_tensors(plain, "moe").values())
    assert got == pytest.approx((s * b * h * 2 + s * b * 2) / tp * (shared > 0))
    extra = kind_params(a, "moe").duplicated - kind_params(plain, "moe").duplicated
    assert extra == h * (shared > 0)
    for module in ("shared_experts", "moe"):
        if shared:
            assert kept_tensors(a, "moe", (module,)) == kept_tensors(plain, "moe", (module,))
            assert "shared.gate" in module_effect(a, "moe", (module,)).repeated_ops


MOE_LLAMA = {**LLAMA, "layers": "moe*8", "num_experts": 4, "top_k": 2, "moe_ffn_hidden_size": 48,
             "shared_experts": 1, "shared_expert_gate": True}


@pytest.mark.parametrize("policy", [StagePolicy(),
                                    StagePolicy(recompute_modules=("shared_experts",)),
                                    StagePolicy(recompute_modules=("moe",))],
                         ids=lambda p: p.label())
def test_the_executors_gated_shared_experts_keep_what_the_model_counts(policy) -> None:
    kept, _ = kept_under_policy(MOE_LLAMA, 0, policy)
    want = module_effect(architecture(MOE_LLAMA), "moe", policy.recompute_modules)
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)


def test_the_flag_sets_it_and_qwen3_next_has_it() -> None:
    a = _parsed("--preset qwen3-30b-a3b --moe-shared-expert-intermediate-size 768 "
                "--moe-shared-expert-gate")
    assert a.shared_expert_gate and a.shared_experts == 1
    assert parse_model({"preset": "qwen3-next-80b-a3b"}).arch.shared_expert_gate


def _mla(**more) -> Architecture:
    return _arch(attention="mla", num_heads=8, num_kv_heads=8, head_dim=32,
                 qk_rope_head_dim=16, v_head_dim=32, **more)


@settings(max_examples=40, deadline=None)
@given(q_rank=st.sampled_from([0, 32, 64]), kv_rank=st.sampled_from([16, 48]),
       s=st.sampled_from([16, 64]), b=st.integers(1, 3), tp=st.sampled_from([1, 2, 4]),
       rms=st.booleans())
def test_mla_has_its_latents_norms_only_with_the_flag(q_rank, kv_rank, s, b, tp, rms) -> None:
    """Megatron builds MLA's up projections as LayerNormLinear with --qk-layernorm (the
    latent, its statistics and the normed latent kept; a weight of the latent's width,
    LayerNorm's bias too), as plain linears without it (the latent alone kept). ppsim
    priced the norms either way."""
    a = _mla(q_lora_rank=q_rank, kv_lora_rank=kv_rank, seq_length=s, micro_batch_size=b,
             tp=tp, norm="rmsnorm" if rms else "layernorm", qk_layernorm=True)
    plain = replace(a, qk_layernorm=False)
    ranks = [r for r in (q_rank, kv_rank) if r]
    per = (1 if rms else 2)
    tok = s * b
    extra = sum(tok * r * 2 + tok * (4 if rms else 8) for r in ranks)  # normed latent, stats
    got = sum(kept_tensors(a, "dense").values()) - sum(kept_tensors(plain, "dense").values())
    assert got == pytest.approx(extra / tp)
    assert kind_params(a, "dense").norms - kind_params(plain, "dense").norms == \
        per * sum(ranks)
    names = {op.name for op in attention_ops(a)} - {op.name for op in attention_ops(plain)}
    assert names == {f"{n}_norm" for n, r in (("q", q_rank), ("kv", kv_rank)) if r}


def test_mla_flags_as_megatron_reads_them() -> None:
    line = ("--num-layers 2 --hidden-size 256 --num-attention-heads 8 --kv-channels 32 "
            "--multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 "
            "--qk-pos-emb-head-dim 16 --v-head-dim 32 --ffn-hidden-size 512 "
            "--vocab-size 1024 --seq-length 128 --normalization RMSNorm --swiglu --bf16")
    assert not _parsed(line).qk_layernorm
    assert _parsed(line + " --qk-layernorm").qk_layernorm
    assert _parsed("--preset deepseek-v3").qk_layernorm  # as its Megatron recipes run it
    code, _, err = _run(["simulate", *shlex.split(line), "--qk-l2-norm"])
    assert code == 2 and "qk_l2_norm is not supported with MLA" in err
