"""Megatron's FLOP count and the throughput line built on it.

The reference below restates Megatron-LM's `num_floating_point_operations`
(megatron/training/training.py) in the closed form of its earlier releases
(Narayanan et al. 2021, arXiv 2104.04473, appendix "Floating-point operations", with
the GQA, SwiGLU, MoE top-k and shared-expert factors training.py added since):

    12 B s L h^2 [ (1 + g/n + s/(2h)) q/h  +  (f/h) k c  +  (f_s/h) c  +  V / (2 L h) ]

B sequences of s tokens, L layers, h hidden, n heads, g query groups, q = kv_channels x n,
f the (expert) MLP width, k experts per token (1 for dense), c = 3/2 with SwiGLU, f_s the
shared experts' width, V the vocabulary padded to 128 x tp. It is independent of
ppsim.job.flops (which follows training.py's current token-linear / core split).
"""

from __future__ import annotations

import json
import math

import pytest

from ppsim.cli.main import main
from ppsim.config.model import parse_model
from ppsim.job.flops import iteration_flops
from ppsim.job.throughput import throughput


def megatron_closed_form(preset: str, batch: int, tp: int = 1) -> float:
    a = parse_model({"preset": preset, "tp": tp}).arch  # type: ignore[union-attr]
    h, s, n, L = a.hidden_size, a.seq_length, a.num_heads, a.num_layers
    q = (a.head_dim or h // n) * n
    g = a.num_kv_heads
    c = 1.5 if a.gated_mlp else 1.0
    f, k = (a.moe_ffn_hidden_size, a.top_k) if a.num_experts else (a.ffn_hidden_size, 1)
    shared = a.shared_experts * a.moe_ffn_hidden_size
    vocab = math.ceil(a.vocab_size / (128 * tp)) * 128 * tp
    return 12 * batch * s * L * h * h * ((1 + g / n + s / (2 * h)) * q / h + f / h * k * c
                                         + shared / h * c + vocab / (2 * L * h))


@pytest.mark.parametrize("preset,tp", [("gpt3-1.3b", 1), ("llama2-7b", 1), ("llama3-8b", 2),
                                       ("llama3-70b", 8), ("gpt3-175b", 8),
                                       ("llama3.1-405b", 8), ("mixtral-8x7b", 1),
                                       ("qwen3-235b-a22b", 4)])
def test_flops_equal_megatrons_closed_form(preset: str, tp: int) -> None:
    a = parse_model({"preset": preset, "tp": tp}).arch  # type: ignore[union-attr]
    assert iteration_flops(a, 16) == pytest.approx(megatron_closed_form(preset, 16, tp),
                                                   rel=1e-12)


def test_mla_and_mtp_follow_training_py() -> None:
    # DeepSeek-V3 by training.py's MLA branch (q_lora 1536, kv_lora 512, 128 heads of
    # 128 + 64 rope, v 128), 3 dense + 58 MoE layers + 1 MTP (MoE), 8 of 2048-wide experts
    # plus one shared, vocabulary 129280 padded to 129280 (a multiple of 128).
    h, n, s = 7168, 128, 4096
    q_term = 1536 * (h + n * (128 + 64) + 1)
    kv_term = 512 * (h + n * (128 + 128) + 1) + h * 64
    linear = 6 * (q_term + kv_term + n * 128 * h)
    core = 6 * (n * (128 + 64) / 2 + n * 128 / 2)
    mlp = 6 * h * (18432 * 3 * 3 + 2048 * 8 * 3 * 59 + 2048 * 3 * 59)
    mtp = 6 * (3 * h + 2 * h * h)
    logits = 6 * h * 129280 * 2
    expect = s * (mlp + linear * 62 + mtp + logits) + s * s * core * 62
    a = parse_model({"preset": "deepseek-v3"}).arch  # type: ignore[union-attr]
    assert iteration_flops(a, 1) == pytest.approx(expect, rel=1e-12)


def test_throughput_units() -> None:
    t = throughput(tokens=4096 * 192, flops=3.0e18, gpus=96, iteration_ms=2000.0,
                   peak_tflops=989.0)
    assert t is not None
    assert t.tokens_per_s == 4096 * 192 / 2.0
    assert t.tokens_per_s_per_gpu == 4096 * 192 / 2.0 / 96
    assert t.tflops_per_gpu == pytest.approx(3.0e18 / 2.0 / 96 / 1e12)
    assert t.mfu == pytest.approx(t.tflops_per_gpu / 989.0)
    assert throughput(tokens=1, flops=1.0, gpus=1, iteration_ms=0.0, peak_tflops=1.0) is None


def test_simulate_json_carries_the_throughput(capsys) -> None:
    assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
                 "--dp", "4", "--global-batch-size", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    t, job = out["throughput"], out["job"]
    seconds = out["iteration_time_ms"] / 1e3
    assert job["gpus"] == 8 and job["global_batch_size"] == 32
    assert t["tokens_per_s"] == pytest.approx(32 * 8192 / seconds)
    assert t["tokens_per_s_per_gpu"] == pytest.approx(32 * 8192 / seconds / 8)
    assert t["tflops_per_gpu"] == pytest.approx(
        megatron_closed_form("llama3-8b", 32) / seconds / 8 / 1e12)
    assert t["mfu"] == pytest.approx(t["tflops_per_gpu"] / 989.0)


def test_uniform_model_has_no_throughput(tmp_path, capsys) -> None:
    cfg = tmp_path / "u.toml"
    cfg.write_text('[model]\nkind = "uniform"\nnum_layers = 4\nforward_ms = 1.0\n'
                   'backward_ms = 2.0\n[pipeline]\npp = 2\nmicrobatches = 4\n')
    assert main(["simulate", "--json", "--config", str(cfg)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["throughput"] is None and out["job"] is None


# torchtitan's count (torchtitan/models/utils.py, get_dense_model_nparams_and_flops and
# get_moe_model_nparams_and_flops), restated on the models' own shapes: 6 x every
# parameter but the untied embedding table (routed experts top_k / num_experts of
# theirs) + 6 x layers x heads x (q/k + v head dims) x seq_length.
def _llama3_8b_titan() -> float:
    h, L, f, V, s = 4096, 32, 14336, 128256, 8192
    layer = 2 * h * h + 2 * h * 1024 + 3 * h * f + 2 * h  # q, o; k, v; SwiGLU; two norms
    return 6 * (L * layer + h + V * h) + 6 * L * 32 * (128 + 128) * s


def _deepseek_v3_titan() -> float:
    h, V, s, heads = 7168, 129280, 4096, 128
    attention = (h * 1536 + 1536 + 1536 * heads * (128 + 64)  # q down, q norm, q up
                 + h * (512 + 64) + 512 + 512 * heads * (128 + 128)  # kv down, norm, up
                 + heads * 128 * h + 2 * h)  # out, the two layer norms
    expert = 3 * h * 2048
    dense = attention + 3 * h * 18432
    moe = attention + h * 256 + expert + 8 * expert  # router, shared, top-8 of 256
    return 6 * (3 * dense + 58 * moe + h + V * h) + 6 * 61 * heads * (128 + 64 + 128) * s


@pytest.mark.parametrize("preset, per_token", [("llama3-8b", _llama3_8b_titan),
                                               ("deepseek-v3", _deepseek_v3_titan)])
def test_torchtitans_mfu_is_its_own_count(preset: str, per_token, capsys) -> None:
    """torchtitan logs MFU = num_flops_per_token x tokens/s per GPU / peak; ppsim gave
    only Megatron's count, which differs (causal half, no norms, the padded vocabulary)."""
    # 256 GPUs: DeepSeek-V3's ep 64 within dp 64 (Megatron's expert world)
    assert main(["simulate", "--preset", preset, "--hardware", "h100-80gb", "--gpus", "256",
                 "--pp", "4", "--global-batch-size", "256", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)["throughput"]
    tflops = per_token() * t["tokens_per_s_per_gpu"] / 1e12
    assert t["torchtitan_tflops_per_gpu"] == pytest.approx(tflops, rel=1e-9)
    assert t["torchtitan_mfu"] == pytest.approx(tflops / 989.0, rel=1e-9)
    assert t["torchtitan_mfu"] != pytest.approx(t["mfu"], rel=1e-3)


# Megatron-Bridge's published pre-training rows (docs/performance-summary-archive.md of
# NVIDIA-NeMo/Megatron-Bridge; NeMo containers 26.02 to 26.08): tokens/s per GPU and
# model TFLOP/s per GPU, each rounded to a whole number, so their ratio is the count per
# token the run logged, within half a unit of each. (preset, tp, tokens/s, TFLOP/s).
BRIDGE_ROWS = [("llama3-70b", 4, 1639, 736), ("llama3-70b", 4, 1633, 734),  # H100 FP8
               ("llama3.1-405b", 8, 326, 822), ("llama3.1-405b", 8, 311, 784),
               ("qwen3-235b-a22b", 2, 1633, 242), ("qwen3-235b-a22b", 2, 1686, 250),
               ("gpt-oss-120b", 1, 5993, 163), ("gpt-oss-120b", 1, 5810, 158),  # H100 BF16
               ("deepseek-v3", 1, 4969, 1292), ("deepseek-v3", 1, 2815, 732),  # GB200, B200
               ("kimi-k2", 1, 5372, 1099), ("kimi-k2", 1, 5072, 1037),  # GB300
               ("qwen3-30b-a3b", 1, 8960, 206), ("qwen3-30b-a3b", 1, 9058, 208)]  # H100


@pytest.mark.parametrize("preset, tp, tokens, tflops", BRIDGE_ROWS)
def test_the_count_per_token_is_the_one_published_runs_logged(preset, tp, tokens,
                                                              tflops) -> None:
    """Held out: each run's logged TFLOP/s over its tokens/s. gpt-oss's gated MLP is
    --quick-geglu, which Megatron counts as two matrices (a SwiGLU count reads 26 % high
    against these rows)."""
    a = parse_model({"preset": preset, "tp": tp}).arch  # type: ignore[union-attr]
    per_token = iteration_flops(a, 1) / a.seq_length
    low, high = (tflops - 0.5) * 1e12 / tokens, (tflops + 0.5) * 1e12 / tokens
    assert low * 0.999 <= per_token <= high * 1.001


def test_quick_geglu_counts_two_matrices_and_exports_its_flag(capsys) -> None:
    swiglu = parse_model({"preset": "gpt-oss-120b", "gated_activation": "swiglu"}).arch
    geglu = parse_model({"preset": "gpt-oss-120b"}).arch  # type: ignore[union-attr]
    h, ffn, k, layers = 2880, 2880, 4, 36
    third = 6 * h * ffn * k * layers * 4096  # the third matrix of every token's experts
    assert iteration_flops(swiglu, 1) - iteration_flops(geglu, 1) == pytest.approx(third)
    assert main(["presets", "gpt-oss-120b", "--json"]) == 0
    flags = json.loads(capsys.readouterr().out)["megatron_model_args"].split()
    assert "--quick-geglu" in flags and "--swiglu" not in flags
    assert main(["presets", "llama3-8b", "--json"]) == 0
    assert "--swiglu" in json.loads(capsys.readouterr().out)["megatron_model_args"].split()


def _mamba(h: int, state: int, groups: int, heads: int) -> float:
    d_in = 2 * h  # Megatron's mamba_layer_flops, per token, forward
    return 2 * h * (2 * d_in + 2 * groups * state + heads) + 7 * d_in * state + 2 * d_in * h


def test_hybrid_stacks_follow_megatrons_hybrid_formula() -> None:
    """training.py's hybrid_flops, restated for Nemotron-H-8B (Megatron-LM's
    Nemotron-H-8B-Base-8K.sh: 24 Mamba-2, 24 squared-ReLU MLP and 4 attention layers,
    hidden 4096, 32 heads of 128 in 8 groups, MLP 21504, Mamba state 128 in 8 groups,
    128 heads, vocabulary 131072, sequence 8192): 3 x the forward's FLOPs."""
    h, s, q = 4096, 8192, 32 * 128
    attention = 4 * q * (h + h * 8 / 32) + 2 * s * q  # projections + causal core
    mlp = 4 * 21504 * h
    forward = 24 * _mamba(h, 128, 8, 128) + 24 * mlp + 4 * attention + 2 * h * 131072
    a = parse_model({"preset": "nemotron-h-8b"}).arch  # type: ignore[union-attr]
    assert iteration_flops(a, 2) == pytest.approx(3 * 2 * s * forward, rel=1e-12)


def test_gated_delta_net_moe_and_mtp_in_a_hybrid_stack() -> None:
    """Qwen3-Next-80B-A3B as its pattern builds it (36 G, 12 *, 48 E, an MTP depth of *
    and E): GatedDeltaNet by gdn_layer_flops (16 key heads of 128, 32 value heads of 128,
    a 4-wide convolution), MoE top-10 of 512-wide SwiGLU experts and one shared, the
    logits twice (main and MTP)."""
    h, s, q = 2048, 4096, 16 * 256
    qk, v = 16 * 128, 32 * 128
    gdn = 2 * (h * (2 * qk + 2 * v + 2 * 32) + 4 * (2 * qk + v) + 32 * 128 ** 2 * 4 + h * v)
    attention = 4 * q * (h + h * 2 / 16) + 2 * s * q
    moe = 4 * h * 512 * 10 * 1.5 + 4 * h * 512 * 1.5
    vocab = 151936  # a multiple of 128
    forward = 36 * gdn + 13 * attention + 49 * moe + 2 * h * vocab * 2
    a = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]
    assert iteration_flops(a, 1) == pytest.approx(3 * s * forward, rel=1e-12)
