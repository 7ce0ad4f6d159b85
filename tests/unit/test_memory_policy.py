"""Memory policies: per-module saved bytes and recompute time, the global modes as
shorthand, block N, offload, the [memory] config and its flags."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict, load_config
from ppsim.config.to_toml import config_to_toml
from ppsim.costs.arch import Architecture
from ppsim.costs.modules import OFFLOAD_MODULES, RECOMPUTE_MODULES, module_effect
from ppsim.costs.saved import saved_tensors
from ppsim.costs.transformer import Accelerator, layer_activation_bytes, transformer_costs
from ppsim.errors import UserError
from ppsim.pipeline.problem import build_problem
from ppsim.policy.model import StagePolicy

ACC = Accelerator(peak_tflops=100.0, memory_bandwidth_gbps=1000.0)
DENSE = dict(num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=8, ffn_hidden_size=1024,
             vocab_size=1024, seq_length=128, micro_batch_size=2, dtype="bf16")
MOE = dict(DENSE, layers="dense, moe*3", num_experts=8, top_k=2, moe_ffn_hidden_size=128,
           shared_experts=1)
MLA = dict(MOE, attention="mla", q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16,
           head_dim=32, v_head_dim=32)


def arch(base: dict, **kw) -> Architecture:
    return Architecture(**{**base, **kw})


def simulate_json(*flags: str, capsys) -> dict:
    assert main(["simulate", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("base", "kind"), [(DENSE, "dense"), (MOE, "dense"), (MOE, "moe"),
                                            (MLA, "dense"), (MLA, "moe")])
def test_named_tensors_add_up_to_the_layer(base: dict, kind: str) -> None:
    a = arch(base, tp=2)
    assert abs(sum(saved_tensors(a, kind).values()) - layer_activation_bytes(a, kind)) <= 1


def test_each_module_drops_what_megatron_discards() -> None:
    a = arch(DENSE)  # gated SwiGLU, RMSNorm, bf16: 2 bytes per element
    tok, h, ffn = 128 * 2, 256, 1024
    none = module_effect(a, "dense").kept_bytes
    drop = {m: none - module_effect(a, "dense", (m,)).kept_bytes
            for m in ("core_attn", "layernorm", "mlp", "moe_act", "moe")}
    assert drop["core_attn"] == 4 * tok * 8  # only the fp32 log-sum-exp per head
    # Megatron fuses a dense GQA layer's norms into QKV and fc1, which keep their outputs
    assert drop["layernorm"] == 0
    # fc1+fc3 out and the product: Megatron's fused SwiGLU keeps no SiLU output
    assert drop["mlp"] == tok * 3 * ffn * 2
    assert drop["moe_act"] == drop["moe"] == 0  # no MoE in a dense layer
    full = module_effect(a, "dense", full=True).kept_bytes
    assert full == tok * h * 2


@pytest.mark.parametrize(("base", "kind", "norms"), [
    (DENSE, "dense", 0), (MOE, "moe", 1), (MLA, "dense", 1), (MLA, "moe", 2)])
def test_layernorm_acts_on_the_norms_megatron_keeps_apart(base: dict, kind: str,
                                                          norms: int) -> None:
    """Transformer Engine's spec builds an MLA layer's input norm (before the two down
    projections) and a MoE layer's pre-MLP norm (read by the router and the experts) as
    modules of their own; TransformerLayer skips the fused ones (IdentityOp) for the
    `layernorm` recompute and the `attn_norm` / `mlp_norm` offload. Each separate norm's
    output and 1/rms are what `layernorm` drops."""
    a = arch(base)
    tok, h = a.seq_length * a.micro_batch_size, a.hidden_size
    none = module_effect(a, kind).kept_bytes
    assert none - module_effect(a, kind, ("layernorm",)).kept_bytes == norms * (tok * h * 2
                                                                              + tok * 4)
    offload = module_effect(a, kind, (), ("attn_norm", "mlp_norm")).offloaded_bytes
    assert (offload > 0) == (norms > 0)


def test_moe_modules_overlap_once() -> None:
    a = arch(MOE)
    none = module_effect(a, "moe").kept_bytes
    moe = none - module_effect(a, "moe", ("moe",)).kept_bytes
    both = none - module_effect(a, "moe", ("moe", "moe_act", "shared_experts")).kept_bytes
    assert moe == both > 0
    pairs, ffn = 128 * 2 * 2, 128
    # moe_act discards the activation's output (fc2's input); a fused SwiGLU keeps no
    # SiLU output besides
    assert none - module_effect(a, "moe", ("moe_act",)).kept_bytes == pairs * ffn * 2


def test_recompute_repeats_the_modules_forward_in_the_backward() -> None:
    a = arch(DENSE)
    plain = transformer_costs(a, ACC, recompute=()).layers[0]
    attn = transformer_costs(a, ACC, recompute=("core_attn",)).layers[0]
    full = transformer_costs(a, ACC, full=True).layers[0]
    assert attn.forward_ms == plain.forward_ms
    assert plain.backward_ms < attn.backward_ms < full.backward_ms
    assert full.backward_ms == pytest.approx(plain.backward_ms + plain.forward_ms)


def test_none_is_flash_attention_and_faster_than_selective(capsys) -> None:
    """Issue 28: "none" meant unfused attention storing the s x s scores, slower than
    selective (GPT-3 175B pp 8: 4025 vs 3914 ms)."""
    flags = ["--preset", "gpt3-175b", "--hardware", "h100-80gb", "--pp", "8",
             "--microbatches", "16"]
    none = simulate_json(*flags, "--recompute", "none", capsys=capsys)
    sel = simulate_json(*flags, "--recompute", "selective", capsys=capsys)
    assert none["iteration_time_ms"] < sel["iteration_time_ms"]
    gap = none["ranks"][0]["peak_memory_bytes"] - sel["ranks"][0]["peak_memory_bytes"]
    assert 0 < gap < 0.01 * sel["ranks"][0]["peak_memory_bytes"]  # the log-sum-exp only


@pytest.mark.parametrize(("mode", "policy"), [
    ("selective", ["--recompute-modules", "core_attn"]),
    ("full", ["--recompute-num-layers", "99"]),
    ("none", ["--recompute-num-layers", "0"]),
])
@pytest.mark.parametrize("job", [[], ["--tp", "4"], ["--tp", "2", "--cp", "2"]],
                         ids=["alone", "tp4", "tp2-cp2"])
def test_global_mode_is_shorthand_for_a_uniform_policy(mode, policy, job, capsys) -> None:
    """With tp or cp > 1 the policy's layers carry the job's collectives too (they once
    lost them, and a policy equal to the mode ran 17 % faster than the mode)."""
    flags = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4", *job,
             "--microbatches", "8", "--recompute", "none"]
    g = simulate_json(*flags[:-1], mode, capsys=capsys)
    p = simulate_json(*flags, *policy, capsys=capsys)
    assert p["iteration_time_ms"] == g["iteration_time_ms"]
    assert [r["peak_memory_bytes"] for r in p["ranks"]] == \
        [r["peak_memory_bytes"] for r in g["ranks"]]
    assert "policy" in p and len(p["policy"]) == 4


def test_block_n_trades_time_for_memory(capsys) -> None:
    flags = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
             "--microbatches", "4", "--split", "16,16"]
    runs = [simulate_json(*flags, "--recompute-num-layers", str(n), capsys=capsys)
            for n in (0, 4, 16)]
    times = [r["iteration_time_ms"] for r in runs]
    peaks = [r["ranks"][0]["peak_memory_bytes"] for r in runs]
    assert times[0] < times[1] < times[2]
    assert peaks[0] > peaks[1] > peaks[2]
    assert runs[1]["policy"][0]["recompute_layers"] == 4
    assert runs[2]["policy"][1]["recompute_layers"] == 16  # N capped at the stage's layers


def test_offload_frees_device_memory_and_costs_host_link_time(capsys) -> None:
    flags = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
             "--microbatches", "8"]
    plain = simulate_json(*flags, capsys=capsys)
    off = simulate_json(*flags,
                        "--fine-grained-activation-offloading", "--offload-modules",
                        "core_attn,attn_proj", capsys=capsys)
    assert off["ranks"][0]["peak_memory_bytes"] < plain["ranks"][0]["peak_memory_bytes"]
    assert off["policy"][0]["offload_fraction"] == 1.0
    assert off["iteration_time_ms"] >= plain["iteration_time_ms"]


def test_a_memory_table_naming_offload_modules_offloads_them_as_the_flag_does(
        tmp_path, capsys) -> None:
    # The table without offload_fraction offloaded nothing (fraction 0) where the flag
    # --offload-modules, like Megatron's default --activation-offload-fraction, offloads all.
    flags = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
             "--microbatches", "8"]
    path = tmp_path / "m.toml"
    path.write_text('[model]\npreset = "llama3-8b"\n[memory]\n'
                    'offload_modules = ["core_attn", "attn_proj"]\n')
    table = simulate_json("--config", str(path), *flags[2:], capsys=capsys)
    flag = simulate_json(*flags,
                         "--fine-grained-activation-offloading", "--offload-modules",
                         "core_attn,attn_proj", capsys=capsys)
    plain = simulate_json(*flags, capsys=capsys)
    assert table["policy"][0]["offload_fraction"] == 1.0
    assert table["ranks"] == flag["ranks"] != plain["ranks"]
    path.write_text(path.read_text() + "offload_fraction = 0\n")
    none = simulate_json("--config", str(path), *flags[2:], capsys=capsys)
    assert [r["peak_memory_bytes"] for r in none["ranks"]] == \
        [r["peak_memory_bytes"] for r in plain["ranks"]]
    assert none["iteration_time_ms"] == pytest.approx(plain["iteration_time_ms"])


def test_per_stage_tables_round_trip_and_apply(tmp_path, capsys) -> None:
    data = {"model": {"preset": "llama3-8b"}, "hardware": {"preset": "h100-80gb"},
            "pipeline": {"pp": 2, "microbatches": 4, "split": [16, 16]},
            "memory": {"recompute_modules": ["core_attn"],
                       "stage": [{"stage": 0, "recompute_layers": 5,
                                  "offload_modules": ["attn_proj"], "offload_fraction": 0.5}]}}
    cfg = config_from_dict(data)
    path = tmp_path / "c.toml"
    path.write_text(config_to_toml(cfg))
    assert load_config(str(path)).memory == cfg.memory
    out = simulate_json("--config", str(path), capsys=capsys)
    assert out["policy"][0] == {"stage": 0, "recompute_modules": ["core_attn"],
                                "recompute_layers": 5, "offload_modules": ["attn_proj"],
                                "offload_fraction": 0.5}
    assert out["policy"][1]["recompute_layers"] == 0


@pytest.mark.parametrize(("table", "field"), [
    ({"recompute_modules": ["core_atn"]}, "memory.recompute_modules"),
    ({"offload_modules": ["mlp"]}, "memory.offload_modules"),
    ({"offload_fraction": 1.5}, "memory.offload_fraction"),
    ({"recompute_layers": -1}, "memory.recompute_layers"),
    ({"stage": [{"stage": "x"}]}, "memory.stage.stage"),
    ({"recompute": "full"}, "memory.recompute"),
])
def test_bad_policies_name_the_field(table: dict, field: str) -> None:
    with pytest.raises(UserError, match=field.replace(".", r"\.")):
        config_from_dict({"model": {"preset": "tiny-gpt"}, "memory": table})


def test_bad_flag_exits_2_with_one_line(capsys) -> None:
    assert main(["simulate", "--preset", "tiny-gpt", "--recompute-modules", "attn"]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: --recompute-modules: unknown module 'attn'" in err and "\n" not in err


def test_a_uniform_model_refuses_a_policy() -> None:
    cfg = {"model": {"kind": "uniform", "num_layers": 4, "forward_ms": 1.0},
           "memory": {"recompute_modules": ["core_attn"]}}
    with pytest.raises(UserError, match="memory"):
        build_problem(config_from_dict(cfg))


def test_host_memory_limits_offload(tmp_path, capsys) -> None:
    """Offloaded microbatches live in the node's host memory, shared by its devices."""
    flags = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
             "--microbatches", "8",
             "--fine-grained-activation-offloading", "--offload-modules", "core_attn"]
    out = simulate_json(*flags, capsys=capsys)
    tok, w = 8192, 2
    # q, k, v and out; the preset's selective recompute (core_attn) drops the log-sum-exp
    per_layer = tok * (4096 + 1024 + 1024 + 4096) * w
    # Rank 0 of 1F1B holds 4 microbatches of its 8 layers at once.
    assert out["host_bytes"][0] == 4 * 8 * per_layer and out["host_fits"]
    small = tmp_path / "small.toml"
    small.write_text('[model]\npreset = "llama3-8b"\n[pipeline]\npp = 4\nmicrobatches = 8\n'
                     '[hardware]\npreset = "h100-80gb"\nhost_memory_bytes = 8e9\n'
                     '[memory]\noffload_modules = ["core_attn"]\noffload_fraction = 1.0\n')
    assert main(["simulate", "--config", str(small)]) == 0
    assert "host memory" in capsys.readouterr().err
    out = simulate_json("--config", str(small), capsys=capsys)
    assert not out["host_fits"]


def test_the_trace_shows_each_offload_copy(tmp_path, capsys) -> None:
    trace = tmp_path / "t.json"
    flags = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
             "--microbatches", "3", "--split", "16,16",
             "--fine-grained-activation-offloading", "--offload-modules", "attn_proj"]
    assert main(["simulate", *flags, "--trace", str(trace)]) == 0
    capsys.readouterr()
    copies = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "copy"]
    assert sorted(e["name"] for e in copies if e["pid"] == 0) == sorted(
        [f"offload F{i}" for i in range(3)] + [f"reload B{i}" for i in range(3)])
    per_layer = 8192 * 4096 * 2  # attn_proj's input: the attention output
    assert all(e["args"]["bytes"] == 16 * per_layer for e in copies)
    assert all(e["dur"] == pytest.approx(16 * per_layer / 63e9 * 1e6) for e in copies)


RECOMPUTES = st.lists(st.sampled_from(RECOMPUTE_MODULES), unique=True, max_size=4)
OFFLOADS = st.lists(st.sampled_from(OFFLOAD_MODULES), unique=True, max_size=4)


@given(st.sampled_from([(DENSE, "dense"), (MOE, "moe"), (MLA, "dense"), (MLA, "moe")]),
       RECOMPUTES, OFFLOADS)
def test_offload_frees_at_most_what_it_copies_and_keeps_the_rest(case, recompute, offload):
    base, kind = case
    a = arch(base)
    plain = module_effect(a, kind, tuple(recompute))
    got = module_effect(a, kind, tuple(recompute), tuple(offload))
    assert 0 <= got.freed_bytes <= got.offloaded_bytes
    assert got.kept_bytes + got.freed_bytes == plain.kept_bytes  # freed leaves, the rest stays
    assert got.repeated_ops == plain.repeated_ops


def test_attention_output_leaves_the_device_only_with_both_its_savers_offloaded() -> None:
    a = arch(DENSE)
    out = 128 * 2 * 256 * 2  # tokens x heads x head width, bf16
    alone = module_effect(a, "dense", (), ("core_attn",))
    both = module_effect(a, "dense", (), ("core_attn", "attn_proj"))
    proj = module_effect(a, "dense", (), ("attn_proj",))
    assert alone.offloaded_bytes - alone.freed_bytes == out  # copied, kept by the projection
    assert both.offloaded_bytes == both.freed_bytes == alone.offloaded_bytes
    assert proj.freed_bytes == 0 and proj.offloaded_bytes == out  # attention keeps it too
    # recomputed, attention keeps its inputs only: the projection alone frees its output
    assert module_effect(a, "dense", ("core_attn",), ("attn_proj",)).freed_bytes == out


def test_a_hybrid_stacks_modules_act_on_its_attention_mlp_and_moe_layers(capsys) -> None:
    """Megatron builds a hybrid stack's attention, MLP and MoE layers as TransformerLayers
    with one half: their modules recompute and offload there (simulate, and the search
    offers them); a stack of Mamba layers alone has none, so the search offers block N
    alone there."""
    from ppsim.config.schema import config_from_dict
    from ppsim.policy.search import module_groups
    from ppsim.policy.setup import policy_costs

    def peaks(*flags: str) -> list[int]:
        assert main(["simulate", "--preset", "tiny-hybrid", "--json", *flags]) == 0
        return [r["peak_activation_bytes"] for r in json.loads(capsys.readouterr().out)["ranks"]]

    plain, policy = peaks(), peaks("--recompute-modules", "mlp,core_attn")
    assert all(p < q for p, q in zip(policy, plain, strict=True))
    pc = policy_costs(config_from_dict({"model": {"preset": "tiny-hybrid"}}))
    assert len(module_groups(pc, offload=False)) > 1
    mamba = policy_costs(config_from_dict({"model": {"preset": "tiny-hybrid",
                                                     "hybrid_layer_pattern": "MMMMMMMM"}}))
    assert module_groups(mamba, offload=True) == [StagePolicy()]


def test_no_bias_swiglu_fusion_keeps_the_silu_output_as_megatrons_eager_swiglu(capsys) -> None:
    """Megatron's --no-bias-swiglu-fusion runs the eager SwiGLU, which keeps its SiLU
    output: seq x ffn x 2 bytes more a Llama 3 8B layer (8192 x 14336 at tp 1, bf16).
    Before: taken, not priced; the plan's Megatron line carries it back."""
    base = ["costs", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2", "--json"]
    assert main(base) == 0
    fused = json.loads(capsys.readouterr().out)["groups"][0]["activation_bytes"]
    assert main([*base, "--no-bias-swiglu-fusion"]) == 0
    eager = json.loads(capsys.readouterr().out)["groups"][0]["activation_bytes"]
    assert eager - fused == 8192 * 14336 * 2
    assert main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "8",
                 "--global-batch-size", "64", "--no-bias-swiglu-fusion", "--time-budget",
                 "5", "--json"]) == 0
    assert "--no-bias-swiglu-fusion" in json.loads(capsys.readouterr().out)[
        "best"]["megatron_job_flags"]


OFFLOAD = "--fine-grained-activation-offloading --offload-modules"


@pytest.mark.parametrize(("flags", "want"), [
    ("--recompute-modules core_atn", "did you mean core_attn"),
    (OFFLOAD + " attn", "did you mean attn_norm or attn_proj"),
    (OFFLOAD + " mlp", "'mlp' is one of Megatron's recompute modules"),
    ("--recompute-modules expert_fc1", "'expert_fc1' is one of Megatron's offload modules"),
    ("--recompute-modules gdn_norm_out", "'gdn_norm_out' is not priced by ppsim"),
    (OFFLOAD + " fused_group_mlp", "'fused_group_mlp' is not priced by ppsim"),
])
def test_a_module_name_ppsim_lacks_is_answered_with_what_was_meant(flags: str, want: str,
                                                                   capsys) -> None:
    assert main(["simulate", "--preset", "tiny-gpt", *flags.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert want in err and "\n" not in err


def test_a_misspelt_memory_key_is_answered_with_the_close_key() -> None:
    with pytest.raises(UserError, match="did you mean recompute_modules"):
        config_from_dict({"model": {"preset": "tiny-gpt"},
                          "memory": {"recompute_module": ["core_attn"]}})
