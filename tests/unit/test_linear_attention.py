"""GatedDeltaNet in a GPT model's layers (Megatron --experimental-attention-variant
gated_delta_net --linear-attention-freq N): how Megatron-Bridge runs Qwen3-Next and
Qwen3.5. ppsim refused both flags as unknown arguments; a hybrid pattern was the only
spelling, whose pipeline splits count a mixer and its MLP as two layers where Megatron's
GPT model counts one."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from helpers import kept_under_policy
from helpers import run_main as _run
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict, load_config
from ppsim.costs.arch import Architecture
from ppsim.costs.kinds import kind_effect
from ppsim.costs.mixers import GDN_CHUNK, delta_shape
from ppsim.costs.stack import layer_kinds
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.executor.builders.llama import architecture
from ppsim.job.flops import iteration_flops
from ppsim.policy.model import StagePolicy

QWEN3_NEXT = """--num-layers 48 --hidden-size 2048 --ffn-hidden-size 5120
--num-attention-heads 16 --group-query-attention --num-query-groups 2 --kv-channels 256
--swiglu --normalization RMSNorm --position-embedding-type rope
--untie-embeddings-and-output-weights --qk-layernorm --attention-output-gate
--experimental-attention-variant gated_delta_net --linear-attention-freq 4
--linear-conv-kernel-dim 4 --linear-key-head-dim 128 --linear-value-head-dim 128
--linear-num-key-heads 16 --linear-num-value-heads 32 --num-experts 512
--moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 512
--moe-shared-expert-gate --moe-router-topk 10 --moe-permute-fusion --mtp-num-layers 1
--seq-length 4096
--micro-batch-size 1 --vocab-size 151936 --bf16 --attention-dropout 0 --hidden-dropout 0
--recompute-granularity selective --expert-model-parallel-size 8 --disable-bias-linear"""
"""Qwen3-Next-80B-A3B as Megatron-Bridge's Qwen3NextBridge builds it (its HF config's
sizes), in Megatron's arguments."""
PATTERN = "GEGEGE*E" * 12 + "/*E"
"""The same layers as a hybrid pattern (the qwen3-next-80b-a3b preset's)."""


def _simulate(line: str, *more: str) -> dict:
    code, out, err = _run(["simulate", *shlex.split(line), "--hardware", "h100-80gb",
                           "--json", *more])
    assert code == 0, err
    return json.loads(out)


def _as_pattern(line: str) -> str:
    return (line.replace("--num-layers 48", f"--hybrid-layer-pattern {PATTERN}")
            .replace("--experimental-attention-variant gated_delta_net", "")
            .replace("--linear-attention-freq 4", "").replace("--mtp-num-layers 1", ""))


def test_a_gpt_model_with_gated_delta_net_prices_as_the_same_hybrid_stack() -> None:
    """On one pipeline stage the GPT model and the hybrid pattern of its layers run the
    same modules: the same time and memory to the digit. Megatron counts their FLOPs by
    two formulas: the GPT one counts the output gate's projection and MTP's projection."""
    job = ("--gpus", "8", "--global-batch-size", "16")
    gpt, hybrid = _simulate(QWEN3_NEXT, *job), _simulate(_as_pattern(QWEN3_NEXT), *job)
    assert gpt["iteration_time_ms"] == pytest.approx(hybrid["iteration_time_ms"], rel=1e-12)
    assert [r["peak_memory_bytes"] for r in gpt["ranks"]] == \
        [r["peak_memory_bytes"] for r in hybrid["ranks"]]
    assert gpt["throughput"]["tflops_per_gpu"] > hybrid["throughput"]["tflops_per_gpu"]


def test_its_pipeline_splits_count_decoder_layers() -> None:
    """48 layers on 4 stages: 12 each, where the pattern's 97 symbols split otherwise."""
    got = _simulate(QWEN3_NEXT, "--gpus", "32", "--global-batch-size", "64", "--pp", "4")
    assert got["split"] == [12, 12, 12, 13]  # the MTP module on the last stage


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(2, 12), freq=st.integers(1, 5), moe=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]), tp=st.sampled_from([1, 2]))
def test_a_gated_delta_net_layer_costs_its_two_hybrid_layers(layers, freq, moe, recompute,
                                                               tp) -> None:
    """Each 'gdn-*' layer is the pattern's GatedDeltaNet layer and its MLP or MoE layer
    run as one piece: time (the host's per-kernel floor aside, which bounds a whole
    piece), weights and (but under full recompute, which keeps the piece's input alone)
    kept bytes their sums."""
    base = dict(num_layers=layers, hidden_size=128, num_heads=4, num_kv_heads=2,
                ffn_hidden_size=256, vocab_size=512, seq_length=128, tp=tp,
                recompute=recompute, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=32, linear_value_head_dim=32)
    if moe:
        base.update(num_experts=4, top_k=2, moe_ffn_hidden_size=64)
    cfg = config_from_dict({"model": {"kind": "transformer", **base,
                                      "experimental_attention_variant": "gdn",
                                      "linear_attention_freq": str(freq)},
                            # no host floor: it bounds a piece's phases, not each layer's
                            "hardware": {"preset": "h100-80gb", "kernel_overhead_us": 0.0}})
    a = cfg.model.arch
    kinds = layer_kinds(a)
    assert [k.startswith("gdn-") for k in kinds] == [(i + 1) % freq != 0
                                                    for i in range(layers)]
    assume(any(k.startswith("gdn-") for k in kinds))
    acc = accelerator(cfg.hardware)
    costs = transformer_costs(a, acc)
    i = next(i for i, k in enumerate(kinds) if k.startswith("gdn-"))
    pattern = replace(a, experimental_attention_variant="", linear_attention_freq="",
                      hybrid_layer_pattern="GE" if moe else "G-", num_layers=2)
    halves = transformer_costs(pattern, acc).layers
    layer = costs.layers[i]
    for f in ("forward_ms", "backward_ms", "weight_grad_ms"):
        assert getattr(layer, f) == pytest.approx(sum(getattr(h, f) for h in halves)), f
    assert layer.static_bytes == sum(h.static_bytes for h in halves)
    if recompute == "full":
        assert layer.activation_bytes == halves[0].activation_bytes
    else:
        assert layer.activation_bytes == sum(h.activation_bytes for h in halves)


def test_megatrons_flop_count_of_a_gpt_model_with_gated_delta_net() -> None:
    """transformer_flops (training.py): each linear layer's in_proj, conv, delta rule and
    out_proj (2 FLOPs a multiply-add, 3 passes) in place of attention's projections and
    core; --linear-attention-freq 4 over the 48 decoder layers and the MTP layer (49th:
    linear); the output gate's projection in the other 13; MTP's norms and projection."""
    a = _arch_of(QWEN3_NEXT)
    h, s, v = 2048, 4096, 151936
    qk, val, heads_v = 16 * 128, 32 * 128, 32
    gdn = 6 * (h * (2 * qk + 2 * val + 2 * heads_v) + 4 * (2 * qk + val)
               + heads_v * 128 ** 2 * 4 + h * val)
    q, kv = 16 * 256, 2 * 256
    attn_linear = 6 * (h * (q + 2 * kv + q) + q * h)
    attn_core = 6 * q / 2 * 2
    moe = 6 * h * (512 * 10 * 3 + 512 * 3)
    linear_layers = sum((i + 1) % 4 != 0 for i in range(49))
    assert linear_layers == 37
    per_token = (49 * moe + linear_layers * gdn + 12 * attn_linear
                 + 6 * (3 * h + 2 * h * h) + 6 * h * v * 2)
    want = s * per_token + s * s * attn_core * 12
    assert iteration_flops(a, 1) == pytest.approx(want, rel=1e-12)


def _arch_of(line: str) -> Architecture:
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser

    args = build_parser().parse_args(["simulate", *shlex.split(line)])
    return config_from_args(args).model.arch


@pytest.mark.parametrize("flags, said", [
    ("--experimental-attention-variant gated_delta_net",
     "Linear attention type gated_delta_net is specified but linear_attention_freq is None"),
    ("--experimental-attention-variant gdn2 --linear-attention-freq 4",
     "'gdn2' is not priced"),
    ("--experimental-attention-variant gdn --linear-attention-freq 4 "
     "--linear-conv-kernel-dim 0", "model.linear_conv_kernel_dim"),
    ("--experimental-attention-variant gdn --linear-attention-freq '([1]*3+[0])*3'",
     "Invalid length of linear_attention_pattern: 12, expected 8"),
    ("--experimental-attention-variant gdn --linear-attention-freq 2 --window-size 5,0",
     "model.experimental_attention_variant"),
])
def test_what_megatron_or_ppsim_refuses_is_refused_in_one_line(flags: str, said: str) -> None:
    code, out, err = _run(["simulate", "--preset", "llama3-8b", "--num-layers", "8",
                           "--hardware", "h100-80gb", *shlex.split(flags)])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], err


def test_the_frequency_alone_is_ignored_as_megatron_ignores_it() -> None:
    code, out, err = _run(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                           "--linear-attention-freq", "4", "--json"])
    assert code == 0 and "ignored without a linear --experimental-attention-variant" in err
    assert json.loads(out)["iteration_time_ms"] == \
        _simulate("--preset llama3-8b")["iteration_time_ms"]
    assert not _arch_of("--preset llama3-8b --linear-attention-freq 4").linear_attention_freq


def test_a_list_places_the_linear_layers_and_prints_back() -> None:
    from ppsim.cli.megatron_args import megatron_model_args

    line = ("--preset llama3-8b --num-layers 8 --experimental-attention-variant gdn "
            "--linear-attention-freq '([1]*3+[0])*2'")
    a = _arch_of(line)
    assert layer_kinds(a) == ("gdn-dense",) * 3 + ("dense",) + ("gdn-dense",) * 3 + ("dense",)
    back = _arch_of(" ".join(shlex.quote(x) for x in megatron_model_args(a)))
    assert layer_kinds(back) == layer_kinds(a)


GPT = load_config(None).model.fields()
LINEAR = {**GPT, "gated_mlp": True, "norm": "rmsnorm", "position": "rotary", "num_kv_heads": 2,
          "ffn_hidden_size": 176, "dtype": "bf16", "experimental_attention_variant": "gdn",
          "linear_attention_freq": "2",
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16}
LINEAR_MOE = {**LINEAR, "num_experts": 4, "top_k": 2, "moe_ffn_hidden_size": 48,
              "shared_experts": 1}
FP32, BF16 = 4, 2


@pytest.mark.parametrize("fields", [LINEAR, LINEAR_MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("policy", [StagePolicy(), StagePolicy(recompute_modules=("moe",)),
                                    StagePolicy(recompute_modules=("shared_experts",))],
                         ids=lambda p: p.label())
def test_the_executor_runs_the_layer_and_keeps_what_the_model_counts(fields, policy) -> None:
    """Layer 0 is GatedDeltaNet's with its MLP or MoE block, layer 1 attention's; what
    each keeps equals the model's, less the chunk matrix and states FLA keeps and the
    reference recomputes, plus q and k repeated to the value heads (test_hybrid_kept)."""
    a = architecture(fields)
    kinds = layer_kinds(a)
    for index in (0, 1):
        kept, _ = kept_under_policy(fields, index, policy)
        want = kind_effect(a, kinds[index], policy.recompute_modules).kept_bytes
        if kinds[index].startswith("gdn-"):
            d, tok = delta_shape(a), a.seq_length * a.micro_batch_size
            heads, dk, dv = d.value_heads, a.linear_key_head_dim, a.linear_value_head_dim
            want += -tok * heads * GDN_CHUNK * FP32 - tok // GDN_CHUNK * heads * dk * dv * FP32 \
                + 2 * tok * (heads - a.linear_num_key_heads) * dk * BF16
        assert abs(kept - want) <= 0.02 * want, (kinds[index], kept, want)


def test_over_the_hybrid_preset_the_flags_build_the_gpt_model() -> None:
    """The preset's note: the four flags after it give Megatron-Bridge's GPT model (the
    pattern dropped), the same as the whole line."""
    job = ("--gpus", "32", "--global-batch-size", "64", "--pp", "4")
    over = _simulate("--preset qwen3-next-80b-a3b --num-layers 48 --experimental-attention-"
                     "variant gated_delta_net --linear-attention-freq 4 --mtp-num-layers 1", *job)
    assert over["split"] == [12, 12, 12, 13]
    assert over["iteration_time_ms"] == _simulate(QWEN3_NEXT, *job)["iteration_time_ms"]


# ------------------------------------------------------------------ DeepSeek sparse attention

DSA_TEST = """--num-layers 4 --hidden-size 512 --num-attention-heads 8 --multi-latent-attention
--q-lora-rank 192 --kv-lora-rank 64 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16
--experimental-attention-variant dsa --disable-bias-linear --dsa-indexer-n-heads 64
--dsa-indexer-head-dim 128 --dsa-indexer-topk 2048 --dsa-indexer-loss-coeff 0.01
--attention-backend fused --micro-batch-size 4 --global-batch-size 32 --seq-length 1024
--max-position-embeddings 1024 --tensor-model-parallel-size 2
--pipeline-model-parallel-size 2 --sequence-parallel --untie-embeddings-and-output-weights
--attention-softmax-in-fp32 --vocab-size 50257"""
"""Megatron-LM's functional test gpt3_mcore_te_tp2_pp2_dsa's model and parallel arguments."""


def test_megatrons_dsa_test_model_prices_as_its_hybrid_pattern() -> None:
    """Every layer MLA through the indexer's top-k keys, with its MLP: on one stage the
    same time and memory as the pattern D-D-D-D-; Megatron counts its FLOPs as the dense
    MLA model's (transformer_flops has no sparse term); the indexer's loss said unpriced."""
    code, out, err = _run(["simulate", *shlex.split(DSA_TEST), "--gpus", "8", "--hardware",
                           "h100-80gb", "--json"])
    assert code == 0, err
    assert "--dsa-indexer-loss-coeff taken, not priced" in err
    assert json.loads(out)["split"] == [2, 2]
    # At DeepSeek's widths, where no layer is bound by the host's per-kernel floor (which
    # bounds a whole piece, so two pieces can take longer than one of both)
    wide = (DSA_TEST.replace("--hidden-size 512", "--hidden-size 4096")
            .replace("--num-attention-heads 8", "--num-attention-heads 32")
            .replace("--qk-head-dim 16", "--qk-head-dim 128").replace("--v-head-dim 16",
                                                                      "--v-head-dim 128")
            .replace("--seq-length 1024", "--seq-length 4096").replace(
                "--max-position-embeddings 1024", "--max-position-embeddings 4096"))
    one = ("--gpus", "4")  # on one stage: the line's own size set to 1, not overridden
    wide = wide.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1")
    gpt = _simulate(wide, *one)
    hybrid = _simulate(wide.replace("--num-layers 4", "--hybrid-layer-pattern D-D-D-D-")
                       .replace("--experimental-attention-variant dsa", ""), *one)
    assert gpt["iteration_time_ms"] == pytest.approx(hybrid["iteration_time_ms"], rel=1e-12)
    assert [r["peak_memory_bytes"] for r in gpt["ranks"]] == \
        [r["peak_memory_bytes"] for r in hybrid["ranks"]]
    a = _arch_of(DSA_TEST)
    assert set(layer_kinds(a)) == {"dsa-dense"}
    assert iteration_flops(a, 32) == iteration_flops(replace(a,
                                                             experimental_attention_variant=""), 32)


def test_dsa_needs_mla_as_megatron_asserts() -> None:
    code, out, err = _run(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                           "--experimental-attention-variant", "dsa"])
    assert code == 2 and "Currently only MLA supports sparse attention." in err
    assert len(err.strip().splitlines()) == 1


def test_deepseek_v3_with_dsa_splits_its_61_layers() -> None:
    """DeepSeek-V3.2's shape: the V3 preset with the variant and its indexer's sizes."""
    got = _simulate("--preset deepseek-v3 --experimental-attention-variant dsa "
                    "--dsa-indexer-n-heads 64 --dsa-indexer-head-dim 128 --dsa-indexer-topk "
                    "2048", "--gpus", "1024", "--global-batch-size", "1024", "--pp", "8")
    assert sum(got["split"]) == 62  # 61 decoder layers and the MTP module
    plain = _simulate("--preset deepseek-v3", "--gpus", "1024", "--global-batch-size", "1024",
                      "--pp", "8")
    assert got["iteration_time_ms"] != plain["iteration_time_ms"]


def test_over_a_gpt_model_with_gated_delta_net_the_frequency_alone_changes(tmp_path) -> None:
    """A config's GPT model with GatedDeltaNet takes --linear-attention-freq alone, as
    its other sizes; only without a linear variant is it ignored."""
    toml = tmp_path / "next.toml"
    toml.write_text('[model]\npreset = "qwen3-next-80b-a3b"\nhybrid_layer_pattern = ""\n'
                    'num_layers = 48\nmtp_layers = 1\n'
                    'experimental_attention_variant = "gdn"\nlinear_attention_freq = "4"\n')
    a = _arch_of(f"--config {toml} --linear-attention-freq 2")
    assert layer_kinds(a)[:4] == ("gdn-moe", "moe", "gdn-moe", "moe")


@pytest.mark.parametrize("missing", ["--dsa-indexer-n-heads", "--dsa-indexer-head-dim",
                                     "--dsa-indexer-topk"])
def test_megatrons_dsa_flags_without_an_indexer_size_are_refused(missing: str) -> None:
    """TransformerConfig's dsa_indexer_n_heads, _head_dim and _topk default to None and
    dsa.py builds the indexer from them: a launch line without one fails in Megatron."""
    sizes = {"--dsa-indexer-n-heads": "64", "--dsa-indexer-head-dim": "128",
             "--dsa-indexer-topk": "2048"}
    given = [x for flag, v in sizes.items() if flag != missing for x in (flag, v)]
    code, out, err = _run(["simulate", "--preset", "deepseek-v3", "--hardware", "h100-80gb",
                           "--pp", "16", "--ep", "8", "--microbatches", "16",
                           "--experimental-attention-variant", "dsa", *given])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"error: {missing}:" in err


@pytest.mark.parametrize("flag", ["--dsa-indexer-n-heads", "--dsa-indexer-head-dim",
                                  "--dsa-indexer-topk"])
def test_an_indexer_size_of_0_is_refused(flag: str) -> None:
    """An indexer of no heads, of heads no wide, or attending to no key: no indexer
    Megatron builds, refused by its field rather than priced."""
    sizes = {"--dsa-indexer-n-heads": "64", "--dsa-indexer-head-dim": "128",
             "--dsa-indexer-topk": "2048", flag: "0"}
    code, out, err = _run(["simulate", "--preset", "deepseek-v3", "--hardware", "h100-80gb",
                           "--pp", "16", "--ep", "8", "--microbatches", "16",
                           "--experimental-attention-variant", "dsa",
                           *(x for item in sizes.items() for x in item)])
    field = flag.removeprefix("--").replace("-", "_")
    assert (code, out) == (2, "")
    assert err == f"ppsim simulate: error: model.{field}: must be at least 1, got 0 " \
        "(use a whole number >= 1)\n"
