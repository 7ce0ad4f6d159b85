"""Megatron's model arguments: a launch script's MODEL_ARGS pasted after a ppsim command.

`ppsim simulate --num-layers 32 --hidden-size 4096 --swiglu ...` was "unrecognized
arguments" for every flag but the layer count, so a user had to translate their job into
a TOML [model] table before ppsim could price it."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
import shlex
from contextlib import redirect_stdout

import pytest
from helpers import arch_meaning
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.flags import add_config_flags, config_from_args
from ppsim.cli.main import build_parser, main
from ppsim.cli.megatron_moe import layer_kinds_spec
from ppsim.config.model import parse_model
from ppsim.config.presets import MODEL_PRESETS
from ppsim.costs.layerops import padded_vocab
from ppsim.costs.patterns import moe_layers
from ppsim.costs.stack import layer_kinds

# Llama-3-8B as a Megatron launch script writes it (Megatron's Llama-3 example arguments).
LLAMA3_8B = """--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
--num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
--seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 --swiglu
--normalization RMSNorm --norm-epsilon 1e-5 --position-embedding-type rope
--rotary-base 500000 --untie-embeddings-and-output-weights --disable-bias-linear
--attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.02 --bf16
--attention-softmax-in-fp32 --sequence-parallel --micro-batch-size 1"""
# DeepSeek-V3 as Megatron's DeepSeek-V3 recipe writes it.
DEEPSEEK_V3 = """--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432
--num-attention-heads 128 --kv-channels 128 --multi-latent-attention --q-lora-rank 1536
--kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
--num-experts 256 --moe-layer-freq ([0]*3+[1]*58) --moe-ffn-hidden-size 2048
--moe-shared-expert-intermediate-size 2048 --moe-router-topk 8 --mtp-num-layers 1
--vocab-size 129280 --swiglu --normalization RMSNorm --position-embedding-type rope
--untie-embeddings-and-output-weights --seq-length 4096 --bf16 --disable-bias-linear
--attention-dropout 0 --hidden-dropout 0 --use-distributed-optimizer --moe-permute-fusion
--qk-layernorm"""
JOB = "--hardware h100-80gb --pp 4 --microbatches 8 --dp 1"


def _json(argv: list[str]) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*argv, "--json"]) == 0
    return json.loads(out.getvalue())


def _arch(argv: str):
    p = argparse.ArgumentParser()
    add_config_flags(p)
    return config_from_args(p.parse_args(shlex.split(argv))).model.arch


@pytest.mark.parametrize("script, preset, extra", [
    (LLAMA3_8B, "llama3-8b", "--recompute-granularity selective"),
    (DEEPSEEK_V3, "deepseek-v3", "--recompute-granularity selective --ep 8"),
], ids=["llama3-8b", "deepseek-v3"])
def test_a_launch_scripts_model_arguments_price_as_the_preset_of_that_model(
        script: str, preset: str, extra: str) -> None:
    ours = _json(["simulate", *shlex.split(f"{script} {JOB} {extra}")])
    theirs = _json(["simulate", "--preset", preset, *shlex.split(f"{JOB} {extra}")])
    assert ours["iteration_time_ms"] == theirs["iteration_time_ms"]
    assert [r["peak_memory_bytes"] for r in ours["ranks"]] == \
        [r["peak_memory_bytes"] for r in theirs["ranks"]]
    assert ours["split"] == theirs["split"]


def test_what_the_flags_leave_out_is_megatrons_default() -> None:
    a = _arch("--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 "
              "--vocab-size 50257")
    # arguments.py: 4h GeLU MLP; TransformerConfig: LayerNorm, dropout 0.1; fp32 without
    # --bf16; tied embeddings without --untie-...; learned_absolute positions; MHA.
    assert (a.ffn_hidden_size, a.gated_mlp, a.norm, a.position) == \
        (16384, False, "layernorm", "learned")
    assert (a.dtype, a.tie_embeddings, a.dropout, a.num_kv_heads) == ("fp32", True, True, 32)
    swiglu = _arch("--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --seq-length "
                   "2048 --vocab-size 50257 --swiglu --num-experts 8 --bf16")
    # int((4 * 4096 * 2 / 3) / 64) * 64 = int(170.67) * 64; a router's top-k 2; experts
    # as wide as the dense MLP (arguments.py); every layer MoE (--moe-layer-freq 1).
    assert (swiglu.ffn_hidden_size, swiglu.top_k, swiglu.moe_ffn_hidden_size) == \
        (10880, 2, 10880)
    assert layer_kinds(swiglu) == ("moe",) * 4 and swiglu.dtype == "bf16"
    mla = _arch("--num-layers 2 --hidden-size 1024 --num-attention-heads 8 --seq-length 512 "
                "--vocab-size 1000 --multi-latent-attention")
    assert (mla.attention, mla.kv_lora_rank, mla.head_dim, mla.qk_rope_head_dim,
            mla.v_head_dim, mla.q_lora_rank) == ("mla", 32, 128, 64, 128, 0)


def test_over_a_preset_the_flags_change_only_what_they_name(capsys) -> None:
    a = _arch("--preset llama3-8b --hidden-size 2048 --num-query-groups 2")
    assert (a.hidden_size, a.num_kv_heads, a.ffn_hidden_size, a.gated_mlp) == \
        (2048, 8, 14336, True)
    assert "--num-query-groups 2 ignored without --group-query-attention" in \
        capsys.readouterr().err
    assert _arch("--preset llama3-8b --group-query-attention --num-query-groups 2"
                 ).num_kv_heads == 2
    moe = _arch("--preset llama3-8b --num-experts 8")
    assert (moe.top_k, moe.moe_ffn_hidden_size) == (2, 14336)
    # The preset's experts are 2,048 wide: 4,096 of shared experts is two of them.
    dsv3 = _arch("--preset deepseek-v3 --moe-shared-expert-intermediate-size 4096 "
                 "--moe-layer-freq 2")
    assert dsv3.shared_experts == 2 and layer_kinds(dsv3)[:3] == ("moe", "dense", "moe")
    # Any other width is the shared experts' MLP's own, as Megatron builds it.
    odd = _arch("--preset deepseek-v3 --moe-shared-expert-intermediate-size 3000")
    assert (odd.shared_experts, odd.shared_expert_ffn_hidden_size, odd.shared_width) == \
        (0, 3000, 3000)


def test_a_model_built_from_flags_is_priced_on_a_gpu_and_says_so(capsys) -> None:
    sim = _json(["simulate", "--num-layers", "4", "--hidden-size", "4096",
                 "--num-attention-heads", "32", "--seq-length", "4096", "--vocab-size",
                 "32000", "--bf16", "--position-embedding-type", "rope",
                 "--mtp-num-layers", "1"])  # Megatron's MTP needs rope (or none)
    assert "assuming --hardware h100-80gb: Megatron's flags" in capsys.readouterr().err
    assert sum(r["layers"] for r in sim["ranks"]) == 5  # four decoder layers and the MTP one
    assert sim["memory_limit_bytes"] == 80e9
    # Megatron's pipeline defaults, not the embedded default's two CPU ranks: one stage,
    # and a global batch of micro batch x dp (one microbatch) unless one is given.
    assert (sim["pp"], sim["microbatches"]) == (1, 1)
    job = _json(["simulate", "--num-layers", "4", "--hidden-size", "4096",
                 "--num-attention-heads", "32", "--seq-length", "4096", "--vocab-size",
                 "32000", "--pipeline-model-parallel-size", "2", "--gpus", "8",
                 "--micro-batch-size", "2", "--global-batch-size", "64"])
    assert (job["pp"], job["microbatches"], job["job"]["dp"]) == (2, 8, 4)


@pytest.mark.parametrize("argv, message", [
    ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64",
     "--vocab-size: needed to build the model from Megatron's flags"),
    ("--hidden-size 64", "--num-layers: needed to build the model"),
    ("--hidden-size 64", "without one the flags build the model, over no embedded default"),
    ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 99 "
     "--num-experts 4 --moe-layer-freq [1]*3", "Invalid length of moe_layer_pattern: 3, "
     "expected 4"),
    ("--preset llama3-8b --num-experts 4 --moe-layer-freq __import__('os').getcwd()",
     "is neither a number nor a list expression of 0 and 1"),
    ("--preset llama3-8b --position-embedding-type relative",
     "--position-embedding-type: 'relative'"),
    ("--preset llama3-8b --bf16 --fp16", "--bf16: and --fp16 both given"),
    ("--preset llama3-8b --recompute-granularity full --recompute-method uniform "
     "--moe-layer-recompute", "Do not set --moe-layer-recompute with full recompute"),
    ("--preset deepseek-v3 --moe-token-dispatcher-type allgather --ep 1 "
     "--moe-shared-expert-overlap", "moe_shared_expert_overlap only works with alltoall"),
    ("--preset llama3-8b --hidden-dropout nan", "--hidden-dropout: dropout probabilities"),
    ("--preset llama3-8b --bf16 --fp4-format nvfp4", "--fp4-format: 'nvfp4': Megatron's FP4 "
     "format is e2m1"),
    ("--preset llama3-8b --fp8-format hybrid --first-last-layers-bf16",
     "model.first_last_layers_bf16: Delayed scaling does not support first / last layer"),
    ("--preset llama3-8b --fp8-format hybrid --fp8-recipe blockwise --first-last-layers-bf16 "
     "--num-layers-at-end-in-bf16 17 --pp 2", "model.num_layers_at_end_in_bf16: "
     "num_layers_at_end_in_bf16 (17) must be between 0 and number of layers per pipeline "
     "stage (16)."),
    ("--preset llama3-8b --hardware h100-80gb --fp8-format hybrid --fp8-recipe mxfp8",
     "model.fp8_recipe: mxfp8 needs tensor cores that run MX formats"),
    ("--preset llama3-8b --fp8-format hybrid --fp8-recipe nvfp4",
     "model.fp8_recipe: nvfp4 scales NVFP4's e2m1 elements, not FP8's"),
    ("--preset llama3-8b --fp8-param-gather", "model.fp8_param_gather: keeps the weights in "
     "FP8 and FP8 is off"),
    ("--preset llama3-8b --fp8-format hybrid --fp8-param-gather", "--fp8-param-gather only "
     "supported with distributed optimizer"),
    ("--preset llama3-8b --fp16 --fp8-format hybrid", "model.dtype: ppsim prices FP8 over "
     "bf16 training"),
    ("--preset llama3-8b --fp8-format hybrid --fsdp", "model.fp8_recipe: torchtitan's "
     "float8 under FSDP (torchao's Float8Linear) scales tensorwise or rowwise"),
    ("--preset tiny-hybrid --fp8-format hybrid", "model.dtype: ppsim prices FP8 over bf16 "
     "training"),
    ("--preset llama3-8b --hardware a100-80gb --fp8-format e4m3", "hardware.fp8_peak_tflops: "
     "is 0: the device has no FP8 tensor cores"),
    ("--preset llama3-8b --moe-layer-freq 2", "--moe-layer-freq: places MoE layers, but"),
])
def test_what_megatron_or_ppsim_cannot_take_is_one_line_naming_the_flag(
        argv: str, message: str, capsys) -> None:
    assert main(["simulate", *shlex.split(argv)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


@given(st.lists(st.tuples(st.sampled_from((0, 1)), st.integers(1, 9)), min_size=1,
                max_size=8))
def test_a_moe_layer_freq_list_is_the_list_megatron_evaluates(runs) -> None:
    expected = [bit for bit, n in runs for _ in range(n)]
    text = "(" + "+".join(f"[{bit}]*{n}" for bit, n in runs) + ")"
    assert moe_layers(text, len(expected)) == expected
    spec = layer_kinds_spec(expected)
    kinds = [k.strip().split("*") for k in spec.split(",")]
    assert [0 if kind == "dense" else 1 for kind, n in kinds for _ in range(int(n))] == expected


@given(st.integers(1, 12), st.integers(1, 60))
def test_a_moe_layer_freq_number_puts_an_moe_layer_every_n_from_the_first(every: int,
                                                                          n: int) -> None:
    pattern = moe_layers(str(every), n)
    assert [i for i, bit in enumerate(pattern) if bit] == list(range(0, n, every))


MIXTRAL = "simulate --preset mixtral-8x7b --hardware h100-80gb --tp 2 --ep 4 --pp 2"


def test_an_moe_scripts_router_numerics_change_nothing() -> None:
    plain = _json(shlex.split(MIXTRAL))
    assert _json(shlex.split(
        f"{MIXTRAL} --expert-tensor-parallel-size 2 --moe-token-dispatcher-type alltoall "
        "--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 "
        "--moe-router-dtype fp32 --moe-permute-fusion --moe-router-score-function softmax "
        "--cp-comm-type p2p --moe-router-fusion --moe-router-force-load-balancing "
        "--moe-router-padding-for-fp8 --moe-router-padding-for-quantization"
    )) == plain


@pytest.mark.parametrize("flags, message", [
    ("--moe-token-dispatcher-type allgather", "--moe-token-dispatcher-type: allgather"),
    ("--cp-comm-type p2p a2a", "--cp-comm-type: p2p a2a: ppsim prices one type for every "
     "layer"),
    ("--cp-comm-type allgather", "--cp-comm-type: allgather: ppsim prices p2p, all_gather, "
     "a2a, a2a+p2p"),
])
def test_expert_layouts_ppsim_does_not_price_are_refused_by_name(flags: str, message: str,
                                                                 capsys) -> None:
    assert main([*shlex.split(MIXTRAL), *flags.split()]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_a_presets_megatron_arguments_build_that_preset(name: str, capsys) -> None:
    """`ppsim presets NAME` prints the model as a launch script's arguments; read back
    alone (Megatron's defaults for the rest) they are the preset, field for field (dp,
    which Megatron takes from the world size, aside)."""
    from ppsim.config.model import parse_model

    assert main(["presets", name, "--json"]) == 0
    args = json.loads(capsys.readouterr().out)["megatron_model_args"]
    assert arch_meaning(_arch(args)) == arch_meaning(parse_model({"preset": name}).arch)


def test_presets_names_the_presets_when_given_another_name(capsys) -> None:
    assert main(["presets", "h100"]) == 2
    err = capsys.readouterr().err
    assert "NAME: 'h100' is not a preset" in err and "llama3-8b" in err
    assert "did you mean h100-80gb?" in err
    assert main(["presets", "llama3-8b"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("Megatron: --num-layers 32 --hidden-size 4096")


def test_megatrons_mamba_recipe_takes_no_position_embedding() -> None:
    """examples/mamba/train.sh passes --position-embedding-type none; it was refused. No
    table and no rotary op: less than learned positions (a table of seq x hidden, whole on
    each rank, with its gradient and optimizer state, as Megatron's embedding and the
    executor build it) and less than rope's rotary op."""
    hybrid = ("simulate --hybrid-layer-pattern M-M-M*-M- --hidden-size 256 "
              "--num-attention-heads 8 --group-query-attention --num-query-groups 8 "
              "--seq-length 512 --vocab-size 1000 --bf16 --hardware h100-80gb")
    runs = {kind: _json(shlex.split(f"{hybrid} --position-embedding-type {kind}"))
            for kind in ("none", "learned_absolute", "rope")}
    times = {kind: run["iteration_time_ms"] for kind, run in runs.items()}
    assert times["none"] < times["learned_absolute"] and times["none"] < times["rope"]
    # bf16 weights with fp32 main grads, master copy and Adam's two moments: 18 B a
    # parameter without the distributed optimizer (Megatron's theoretical memory's rate)
    held = [r["peak_memory_bytes"] for r in runs["learned_absolute"]["ranks"]]
    bare = [r["peak_memory_bytes"] for r in runs["none"]["ranks"]]
    assert held[0] - bare[0] == 512 * 256 * 18
    assert _arch(hybrid.replace("simulate ", "") + " --no-position-embedding").position == "none"


# Megatron-LM's examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-R1.sh, MODEL_ARGS
# as written (the vocabulary comes from its tokenizer: DeepSeek's 129,280).
DEEPSEEK_R1 = """--save-interval 100000 --micro-batch-size 1 --bf16 --no-masked-softmax-fusion
--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope
--no-rope-fusion --normalization RMSNorm --swiglu --num-layers 61 --hidden-size 7168
--ffn-hidden-size 18432 --num-attention-heads 128 --kv-channels 128
--multi-latent-attention --kv-lora-rank 512 --v-head-dim 128 --q-lora-rank 1536
--qk-head-dim 128 --qk-layernorm --qk-pos-emb-head-dim 64 --num-experts 256
--moe-layer-freq [0]*3+[1]*58 --moe-ffn-hidden-size 2048 --moe-router-dtype fp32
--moe-router-score-function sigmoid --moe-router-bias-update-rate 1e-3
--moe-router-enable-expert-bias --moe-router-topk 8 --moe-router-num-groups 8
--moe-router-group-topk 4 --moe-router-pre-softmax --moe-router-topk-scaling-factor 2.5
--moe-shared-expert-overlap --moe-shared-expert-intermediate-size 2048
--moe-aux-loss-coeff 1e-4 --moe-router-load-balancing-type seq_aux_loss
--moe-token-dispatcher-type alltoall --moe-token-drop-policy probs --seq-length 4096
--max-position-embeddings 163840 --tokenizer-type HuggingFaceTokenizer
--make-vocab-size-divisible-by 1280 --use-mcore-models --rotary-base 10000
--rotary-percent 1.0 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0
--recompute-activations --moe-layer-recompute --sequence-parallel --vocab-size 129280"""
R1_JOB = "--hardware h100-80gb --pp 16 --ep 64 --gpus 2048 --global-batch-size 4096"


def test_megatrons_deepseek_r1_model_arguments_price_as_written() -> None:
    """Its MLA and MoE shapes are DeepSeek-V3's without the MTP layer; --recompute-activations
    with --moe-layer-recompute recompute core_attn and moe; its routed all-to-alls hide
    behind the shared expert."""
    ours = _json(["plan", *shlex.split(f"{DEEPSEEK_R1} {R1_JOB}"), "--top", "1",
                  "--tp", "2", "--cp", "1", "--vpp", "1", "--micro-batch-size", "1",
                  "--time-budget", "6"])
    best = ours["best"]
    assert best is not None and best["micro_batch_size"] == 1
    line = best["megatron_job_flags"]
    assert "--recompute-modules core_attn moe" in line
    assert "--moe-shared-expert-overlap" in line
    args = build_parser().parse_args(["simulate", *shlex.split(DEEPSEEK_R1)])
    a = config_from_args(args).model.arch
    preset = _arch("--preset deepseek-v3")
    assert (a.vocab_divisor, a.mtp_layers, a.top_k, a.num_experts, a.kv_lora_rank) == \
        (1280, 0, preset.top_k, preset.num_experts, preset.kv_lora_rank)
    assert layer_kinds(a) == layer_kinds(preset)


def test_the_shared_experts_hide_the_all_to_alls() -> None:
    base = f"--preset deepseek-v3 {R1_JOB} --recompute-granularity selective"
    plain = _json(["simulate", *shlex.split(base)])
    hidden = _json(["simulate", *shlex.split(base), "--moe-shared-expert-overlap"])
    assert hidden["iteration_time_ms"] < plain["iteration_time_ms"]
    # Without expert parallelism there is no all-to-all to hide.
    alone = "--preset deepseek-v3 --hardware h100-80gb --pp 16 --ep 1 --dp 1"
    assert _json(["simulate", *shlex.split(alone)])["iteration_time_ms"] == \
        _json(["simulate", *shlex.split(alone), "--moe-shared-expert-overlap"]
              )["iteration_time_ms"]


def test_the_vocabulary_pads_to_the_given_divisor_times_tp() -> None:
    a = _arch("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 64 "
              "--vocab-size 50257 --make-vocab-size-divisible-by 1280 --tp 2")
    assert padded_vocab(a) == 51200  # ceil(50257 / 2560) x 2560
    again = _arch("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 64 "
                  "--vocab-size 50257 --tp 2")
    assert padded_vocab(again) == 50432  # Megatron's default 128 x 2


IGNORED_VALUES = {None: [], int: ["8192"], float: ["0.5"], str: ["x"], (str,): ["a", "b"],
                  (int,): ["11", "11", "10"], (float,): ["0.1"]}
"""A value of each kind an IGNORED flag takes (a switch: none; a list: several; a whole
number Llama-3-8B's sequence allows as --max-position-embeddings)."""


def _ignored_tail(flags: list[str]) -> list[str]:
    from ppsim.cli.megatron_model import IGNORED

    out = []
    for flag in flags:
        kind = IGNORED[flag]
        out += [f"--{flag}", *IGNORED_VALUES[tuple(kind) if isinstance(kind, list) else kind]]
    return out


def _ignored_flags() -> list[str]:
    from ppsim.cli.megatron_model import IGNORED

    return sorted(IGNORED)


@given(st.lists(st.sampled_from(_ignored_flags()), unique=True, max_size=8))
def test_flags_taken_with_no_effect_leave_the_config_as_it_was(flags) -> None:
    """Any set of the numerics-only flags (YaRN's, gpt-oss's, the router's, DSA's
    indexer's, ...), over Llama-3-8B's arguments, prices the same model."""
    base = _arch(f"{LLAMA3_8B} --use-distributed-optimizer")
    assert _arch(f"{LLAMA3_8B} --use-distributed-optimizer "
                 + " ".join(_ignored_tail(flags))) == base


def test_fewer_positions_than_the_sequence_are_refused_as_megatron_refuses_them(
        capsys) -> None:
    """Megatron asserts max_position_embeddings >= seq_length whatever the position
    embedding; ppsim took --max-position-embeddings 8192 beside --seq-length 32768 and
    priced a line Megatron stops at."""
    base = ["simulate", "--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--tp", "8",
            "--pp", "16", "--microbatches", "16", "--seq-length", "32768"]
    assert main([*base, "--max-position-embeddings", "8192"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--max-position-embeddings: max_position_embeddings (8192) must be greater than " \
        "or equal to seq_length (32768)" in err
    assert main([*base, "--max-position-embeddings", "32768", "--json"]) == 0


def test_tp_comm_overlap_without_sequence_parallel_is_refused_as_megatron_refuses_it(
        capsys) -> None:
    """A model from Megatron's flags at tp 2 with --tp-comm-overlap and no
    --sequence-parallel: refused as Megatron asserts (the overlap needs sequence
    parallelism), naming the config field."""
    line = shlex.split("simulate --num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
                       "--vocab-size 32000 --seq-length 2048 --max-position-embeddings 2048 "
                       "--tensor-model-parallel-size 2 --tp-comm-overlap --bf16 --hardware "
                       "h100-80gb --gpus 2")
    assert main(line) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pipeline.tp_comm_overlap: Tensor parallel communication/GEMM " \
        "overlap can happen only when sequence parallelism is enabled" in err[0]
    assert main([*line, "--sequence-parallel", "--json"]) == 0


@pytest.mark.parametrize("name", [n for n in MODEL_PRESETS
                                  if parse_model({"preset": n}).arch.dp > 1])
def test_a_presets_printed_arguments_with_its_dp_hint_are_that_preset(name: str,
                                                                       capsys) -> None:
    """A preset whose optimizer is sharded over a data-parallel size (llama3.1-405b's 64,
    DeepSeek-V3's 128, Kimi K2's 16) printed Megatron arguments that, pasted alone, priced
    another job: dp 1, the whole optimizer state on every rank (the 405B's first rank
    457 GB against 157). `presets NAME` now names the --dp to add, and with it the
    arguments are the preset, dp included."""
    assert main(["presets", name]) == 0
    lines = capsys.readouterr().out.splitlines()
    args = lines[1].removeprefix("Megatron: ")
    hint = re.search(r"add (--dp \d+)", lines[2])
    assert hint is not None, lines
    preset, pasted = parse_model({"preset": name}).arch, _arch(f"{args} {hint[1]}")
    assert arch_meaning(pasted) == arch_meaning(preset) and pasted.dp == preset.dp > 1


@pytest.mark.parametrize("name", ["h100-80gb", "gb200-186gb", "cpu"])
def test_a_hardware_preset_prints_the_table_a_config_reads_back(name, capsys) -> None:
    """It was refused ("not a model preset"); it prints the [hardware] table to copy."""
    import tomllib

    from ppsim.config.schema import config_from_dict, hardware_config

    assert main(["presets", name]) == 0
    out = capsys.readouterr().out
    table = tomllib.loads(out[out.index("\n[hardware]\n"):])
    assert table["hardware"]["preset"] == name
    without_preset = {k: v for k, v in table["hardware"].items() if k != "preset"}
    read = config_from_dict({"model": {"preset": "tiny-gpt"}, "hardware": without_preset})
    assert read.hardware == dataclasses.replace(hardware_config({"preset": name}),
                                                preset=None)
