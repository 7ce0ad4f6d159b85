"""Shared experts of any width (Megatron's --moe-shared-expert-intermediate-size: one MLP
of that width, megatron/core/transformer/moe/shared_experts.py), and `shared_experts = K`
as the short form of K x moe_ffn_hidden_size."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from helpers import run_cli

from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.model import parse_model
from ppsim.config.presets import MODEL_PRESETS
from ppsim.costs.arch import Architecture
from ppsim.costs.params import kind_params
from ppsim.job.flops import iteration_flops

MOE = dict(num_layers=6, hidden_size=512, num_heads=8, num_kv_heads=8, ffn_hidden_size=2048,
           vocab_size=50257, seq_length=1024, micro_batch_size=4, num_experts=8, top_k=2,
           moe_ffn_hidden_size=1024, layers="moe*6")
"""A CI job's MoE model (gpt3_moe_mcore_te_tp4_ep2_etp2_pp2): every layer MoE."""


def megatron_flops(a: Architecture, batch: int) -> float:
    """training.py's num_floating_point_operations for an all-MoE GPT model, restated:
    12 B s L h^2 [(1 + g/n + s/(2h)) q/h + (f/h) k c + (f_s/h) c + V/(2 L h)], f_s the
    shared expert's width as given (--moe-shared-expert-intermediate-size), c = 3/2 with
    SwiGLU."""
    h, s, n, L = a.hidden_size, a.seq_length, a.num_heads, a.num_layers
    q, g = (a.head_dim or h // n) * n, a.num_kv_heads
    c = 1.5 if a.gated_mlp else 1.0
    vocab = math.ceil(a.vocab_size / (128 * a.tp)) * 128 * a.tp
    return 12 * batch * s * L * h * h * ((1 + g / n + s / (2 * h)) * q / h
                                         + a.moe_ffn_hidden_size / h * a.top_k * c
                                         + a.shared_expert_ffn_hidden_size / h * c
                                         + vocab / (2 * L * h))


@pytest.mark.parametrize("width,gated", [(512, False), (512, True), (1000, True), (20480, False)])
def test_flops_count_the_shared_expert_at_its_own_width(width: int, gated: bool) -> None:
    a = Architecture(**MOE, gated_mlp=gated, shared_expert_ffn_hidden_size=width)
    assert iteration_flops(a, 32) == pytest.approx(megatron_flops(a, 32), rel=1e-12)


def test_a_hybrid_moe_layer_counts_the_shared_expert_at_its_width() -> None:
    """hybrid_flops' moe_layer_flops: 4 x tokens x h x f_s (x 3/2 with SwiGLU), forward
    and backward three times that."""
    base = parse_model({"preset": "tiny-hybrid"}).arch  # type: ignore[union-attr]
    a = dataclasses.replace(base, shared_expert_ffn_hidden_size=40)
    tokens = 8 * a.seq_length
    moe_layers = a.hybrid_layer_pattern.count("E")
    shared = 3 * 4 * tokens * a.hidden_size * 40 * (1.5 if a.gated_mlp else 1.0) * moe_layers
    assert iteration_flops(a, 8) - iteration_flops(base, 8) == pytest.approx(shared, rel=1e-12)


def test_weights_count_one_mlp_of_the_width() -> None:
    for gated in (False, True):
        none = kind_params(Architecture(**MOE, gated_mlp=gated), "moe")
        a = Architecture(**MOE, gated_mlp=gated, shared_expert_ffn_hidden_size=512)
        got = kind_params(a, "moe")
        mlp = 512 * 512 * (3 if gated else 2)
        assert (got.dense - none.dense, got.active - none.active) == (mlp, mlp)
        assert got.experts == none.experts


def _with_width(preset: str) -> str:
    """The preset's model with its shared experts given as a width."""
    p = MODEL_PRESETS[preset]
    width = p["shared_experts"] * p["moe_ffn_hidden_size"]
    return (f'[model]\npreset = "{preset}"\nshared_experts = 0\n'
            f'shared_expert_ffn_hidden_size = {width}\n[hardware]\npreset = "h100-80gb"\n')


SHARED_PRESETS = [n for n, p in MODEL_PRESETS.items() if p.get("shared_experts")]


@pytest.mark.parametrize("extra", [[], ["--gpus", "256"],
                                   ["--recompute-modules", "shared_experts,moe_act"]])
@pytest.mark.parametrize("preset", SHARED_PRESETS)
def test_a_presets_shared_experts_as_a_width_price_to_the_last_digit(
        preset: str, extra: list[str], tmp_path: Path) -> None:
    """`shared_experts = K` is K x moe_ffn_hidden_size: the preset and the same model
    with the width given simulate the same job, every figure equal."""
    cfg = tmp_path / "width.toml"
    cfg.write_text(_with_width(preset))
    count = run_cli(["simulate", "--preset", preset, "--hardware", "h100-80gb", *extra,
                     "--json"])
    width = run_cli(["simulate", "--config", str(cfg), *extra, "--json"])
    assert count.returncode == 0 and width.returncode == 0, (count.stderr, width.stderr)
    assert json.loads(width.stdout) == json.loads(count.stdout)


def test_tp_must_divide_the_width_and_the_error_names_the_field() -> None:
    """Megatron's ColumnParallelLinear divides the shared MLP's width by tp."""
    ran = run_cli(["simulate", "--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb",
                   "--tp", "4", "--moe-shared-expert-intermediate-size", "1002"])
    assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1
    assert "error: model.shared_expert_ffn_hidden_size: 1,002 is not divisible by 4 (tp)" \
        in ran.stderr
    assert "Traceback" not in ran.stderr


def test_a_negative_width_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "negative.toml"
    cfg.write_text('[model]\npreset = "qwen3-30b-a3b"\nshared_expert_ffn_hidden_size = -1\n')
    ran = run_cli(["simulate", "--config", str(cfg)])
    assert ran.returncode == 2
    assert "model.shared_expert_ffn_hidden_size: must be at least 0" in ran.stderr


def test_megatrons_line_gives_the_width_back() -> None:
    a = Architecture(**MOE, shared_expert_ffn_hidden_size=512)
    line = megatron_model_args(a)
    i = line.index("--moe-shared-expert-intermediate-size")
    assert line[i + 1] == "512"


@pytest.mark.parametrize("gated", [False, True])
def test_the_executor_builds_one_mlp_of_the_width(gated: bool) -> None:
    """The built MoE layer holds the parameters the cost model counts for it."""
    pytest.importorskip("torch")
    from ppsim.executor.builders import DEFAULT_BUILDER, load_builder

    fields = {**parse_model({"preset": "tiny-gpt"}).fields(), "gated_mlp": gated,  # type: ignore[union-attr]
              "layers": "dense, moe*7", "num_experts": 4, "top_k": 2,
              "moe_ffn_hidden_size": 48, "shared_expert_ffn_hidden_size": 40}
    b = load_builder(DEFAULT_BUILDER, fields)
    layer = b.layer(1)
    want = kind_params(parse_model(fields).arch, "moe")  # type: ignore[union-attr]
    assert sum(p.numel() for p in layer.parameters()) == want.dense + want.experts
    assert layer.mlp.shared.up.weight.shape == (40, fields["hidden_size"])


@pytest.mark.parametrize(("width", "said"), [
    ("-64", "must be at least 0, got -64"),  # a multiple of the experts' 64: not -1 experts
    (str(64 * 10**8), "must be between 0 and 10,000,000, got 6,400,000,000"),
])
def test_megatrons_width_is_refused_as_given(width: str, said: str) -> None:
    """A width that is no real shared expert is refused as the width the line gave, not
    as a count of experts made from it."""
    ran = run_cli(["simulate", "--preset", "tiny-gpt", "--num-experts", "4",
                   "--moe-ffn-hidden-size", "64", "--moe-shared-expert-intermediate-size",
                   width])
    assert (ran.returncode, ran.stdout) == (2, "")
    assert ran.stderr.startswith("ppsim simulate: error: model.shared_expert_ffn_hidden_size: "
                                 + said), ran.stderr
    assert len(ran.stderr.splitlines()) == 1
