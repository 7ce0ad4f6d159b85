"""GatedDeltaNet's short convolution at any width (Megatron --linear-conv-kernel-dim):
ppsim refused every width but Megatron's default 4. Its weights, its FLOPs (Megatron's
transformer_flops and hybrid_flops multiply the conv's channels by the width) and the
executor's layer follow the flag."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import run_main

from ppsim.config.model import parse_model
from ppsim.costs.mixers import mixer_params
from ppsim.job.flops import iteration_flops

QWEN3_NEXT = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]
KEY, VALUE = 16 * 128, 32 * 128
"""Qwen3-Next's GatedDeltaNet: 16 key heads and 32 value heads of 128."""
CONV_CHANNELS = 2 * KEY + VALUE
"""The conv runs over q, k and v, one filter of `width` taps a channel."""


@pytest.mark.parametrize("width", [1, 2, 6])
def test_the_conv_holds_one_filter_of_the_width_a_channel(width: int) -> None:
    a = replace(QWEN3_NEXT, linear_conv_kernel_dim=width)
    grown = mixer_params(a, "gdn").dense - mixer_params(QWEN3_NEXT, "gdn").dense
    assert grown == (width - 4) * CONV_CHANNELS


@pytest.mark.parametrize("width", [2, 6])
def test_megatrons_flop_count_follows_the_width(width: int) -> None:
    """Qwen3-Next's 36 GatedDeltaNet layers of its pattern: each counts
    2 x width x channels FLOPs a token forward, 3 passes (hybrid_flops' gdn term)."""
    a = replace(QWEN3_NEXT, linear_conv_kernel_dim=width)
    s = QWEN3_NEXT.seq_length
    want = 3 * 2 * s * 36 * (width - 4) * CONV_CHANNELS
    assert iteration_flops(a, 1) - iteration_flops(QWEN3_NEXT, 1) == pytest.approx(want)


def test_a_gpt_model_counts_its_linear_layers_by_the_width() -> None:
    """transformer_flops: --linear-attention-freq 4 over 8 layers makes 6 linear."""
    gpt = replace(QWEN3_NEXT, hybrid_layer_pattern="", num_layers=8, mtp_layers=0,
                  layers="", experimental_attention_variant="gdn", linear_attention_freq="4")
    wide = replace(gpt, linear_conv_kernel_dim=7)
    s = gpt.seq_length
    assert iteration_flops(wide, 1) - iteration_flops(gpt, 1) == \
        pytest.approx(3 * 2 * s * 6 * 3 * CONV_CHANNELS)


def test_the_flag_prices_and_the_throughput_counts_it() -> None:
    def tflops(*more: str) -> float:
        code, out, err = run_main(["simulate", "--preset", "qwen3-next-80b-a3b", "--hardware",
                                   "h100-80gb", "--gpus", "16", "--global-batch-size", "16",
                                   "--json", *more])
        assert code == 0, err
        return json.loads(out)["throughput"]["tflops_per_gpu"]

    assert tflops("--linear-conv-kernel-dim", "6") > tflops() > \
        tflops("--linear-conv-kernel-dim", "2")


@pytest.mark.parametrize("width, said", [("0", "need at least 1"), ("-1", "use 0 to")])
def test_a_width_below_one_is_refused_in_one_line(width: str, said: str) -> None:
    code, out, err = run_main(["simulate", "--preset", "qwen3-next-80b-a3b", "--hardware",
                               "h100-80gb", "--linear-conv-kernel-dim", width])
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1
    assert "model.linear_conv_kernel_dim" in lines[0] and said in lines[0], err


def test_the_executors_layer_holds_the_width_and_stays_causal() -> None:
    torch = pytest.importorskip("torch")
    from ppsim.executor.builders.hybrid import build

    m = parse_model({"preset": "tiny-hybrid", "linear_conv_kernel_dim": 3})
    builder = build(m.fields())
    index = [builder.layer_kind(i) for i in range(builder.num_layers)].index("gdn")
    layer = builder.layer(index)
    want = mixer_params(m.arch, "gdn")  # type: ignore[union-attr]
    assert sum(p.numel() for p in layer.parameters()) == want.dense
    torch.manual_seed(0)
    x = torch.randn(1, 16, m.arch.hidden_size)  # type: ignore[union-attr]
    later = x.clone()
    later[:, 10:] += 1.0
    with torch.no_grad():
        y, y_later = layer(x), layer(later)
    assert y.shape == x.shape
    assert torch.equal(y[:, :10], y_later[:, :10])
    assert not torch.equal(y[:, 10:], y_later[:, 10:])
