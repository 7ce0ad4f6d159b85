"""Sliding-window attention (Megatron's --window-size W,0 and --window-attn-skip-freq):
which layers attend over a window, and the work a window leaves the attention core,
against a count of the query-key pairs made here one query at a time."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import run_main as _run

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.config.presets import MODEL_PRESETS
from ppsim.config.schema import config_from_dict
from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import attention_ops
from ppsim.costs.stack import layer_windows
from ppsim.errors import UserError
from ppsim.pipeline.problem import model_costs


def arch(**kw) -> Architecture:
    return Architecture(**{**MODEL_PRESETS["llama3-8b"], "num_layers": 6, **kw})


def core_flops(a: Architecture, window: int) -> float:
    return next(op.flops for op in attention_ops(a, window) if op.attention)


@pytest.mark.parametrize("window", [1, 127, 1000, 4094, 4095, 9000])
def test_a_window_keeps_the_pairs_it_covers(window: int) -> None:
    a = arch(seq_length=4096)
    # Query i attends to itself and at most `window` keys before it.
    pairs = sum(min(i + 1, window + 1) for i in range(4096))
    causal = sum(i + 1 for i in range(4096))
    expected = pairs / causal
    assert core_flops(a, window) / core_flops(a, 0) == pytest.approx(expected)


def test_which_layers_attend_over_the_window() -> None:
    # Megatron's is_layer_window_attention: layer_number % N != 0, numbers from 1.
    assert layer_windows(arch(attention_window=127, window_attn_skip_freq="2")) == \
        (127, 0, 127, 0, 127, 0)
    assert layer_windows(arch(attention_window=127, window_attn_skip_freq="3")) == \
        (127, 127, 0, 127, 127, 0)
    assert layer_windows(arch(attention_window=127, window_attn_skip_freq="[1,0,0]*2")) == \
        (127, 0, 0, 127, 0, 0)
    assert layer_windows(arch(attention_window=127)) == (127,) * 6
    assert layer_windows(arch()) == (0,) * 6


def test_windowed_layers_cost_less_and_the_rest_are_untouched() -> None:
    def costs(**model):
        return model_costs(config_from_dict({
            "model": {"preset": "llama3-8b", "num_layers": 4, **model},
            "pipeline": {"pp": 1, "microbatches": 2}, "hardware": {"preset": "h100-80gb"}}))

    full = costs()
    swa = costs(attention_window=127, window_attn_skip_freq="2")
    assert swa.layers[1] == full.layers[1] and swa.layers[3] == full.layers[3]
    assert swa.layers[0].forward_ms < full.layers[0].forward_ms
    assert swa.layers[0].backward_ms < full.layers[0].backward_ms
    # FlashAttention keeps the same tensors whatever the window.
    assert swa.layers[0].activation_bytes == full.layers[0].activation_bytes


@pytest.mark.parametrize(("model", "field"), [
    ({"attention_window": 127, "cp": 2}, "model.attention_window"),
    ({"window_attn_skip_freq": "2"}, "model.window_attn_skip_freq"),
    ({"attention_window": 127, "window_attn_skip_freq": "[1,0]"}, "model.window_attn_skip_freq"),
    ({"attention_window": 127, "window_attn_skip_freq": "0"}, "model.window_attn_skip_freq"),
])
def test_bad_windows_are_refused(model: dict, field: str) -> None:
    with pytest.raises(UserError) as e:
        config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, **model}})
    assert e.value.field == field


# Megatron-LM's examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh, MODEL_ARGS as
# written but for ModelOpt's own flags (--export-*, --padded-vocab-size, --enable-gpt-oss);
# the vocabulary is the tokenizer's.
GPT_OSS = """--save-interval 100000 --micro-batch-size 1 --bf16 --no-masked-softmax-fusion
--untie-embeddings-and-output-weights --no-rope-fusion --normalization RMSNorm
--num-layers 36 --hidden-size 2880 --ffn-hidden-size 2880 --num-attention-heads 64
--group-query-attention --num-query-groups 8 --kv-channels 64 --num-experts 128
--moe-ffn-hidden-size 2880 --moe-router-dtype fp32 --moe-router-topk 4
--moe-aux-loss-coeff 0.0 --moe-token-dispatcher-type alltoall
--moe-router-score-function softmax --moe-router-load-balancing-type aux_loss
--seq-length 4096 --max-position-embeddings 40960 --tokenizer-type HuggingFaceTokenizer
--make-vocab-size-divisible-by 128 --use-mcore-models --rotary-percent 1.0
--rotary-base 150000 --no-bias-gelu-fusion --sequence-parallel --no-bias-dropout-fusion
--quick-geglu --glu-linear-offset 1.0 --softmax-type learnable --window-attn-skip-freq 2
--activation-func-clamp-value 7.0 --window-size 127,0 --vocab-size 201088"""


def test_megatrons_gpt_oss_arguments_are_the_preset() -> None:
    args = build_parser().parse_args(["simulate", *shlex.split(GPT_OSS)])
    a = config_from_args(args).model.arch
    preset = Architecture(**MODEL_PRESETS["gpt-oss-120b"])
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "num_experts", "top_k", "moe_ffn_hidden_size", "vocab_size", "gated_mlp",
                  "attention_window", "window_attn_skip_freq", "tie_embeddings"):
        assert getattr(a, field) == getattr(preset, field), field
    code, out, err = _run(["simulate", *shlex.split(GPT_OSS), "--hardware", "h100-80gb",
                           "--ep", "8", "--pp", "4", "--gpus", "64", "--global-batch-size",
                           "64", "--json"])
    assert code == 0, err
    assert json.loads(out)["job"]["ep"] == 8


@pytest.mark.parametrize(("flags", "message"), [
    ("--window-size 127,5", "--window-size: 127,5: keys after a query"),
    ("--window-size 12x", "--window-size: '12x' is not two whole numbers"),
    ("--quick-geglu --swiglu", "--quick-geglu: and --swiglu both given"),
])
def test_window_flags_megatron_or_ppsim_cannot_take(flags: str, message: str) -> None:
    code, _, err = _run(["simulate", "--preset", "llama3-8b", *shlex.split(flags)])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
