"""NVFP4 as Megatron runs it with Transformer Engine on Blackwell (--fp4-format e2m1,
NVFP4BlockScaling; ppsim refused --fp4-format): the linears FP8 would quantize run at the
FP4 peak, each operand quantized rowwise and columnwise; an element takes 4 bits and its
share of a 16-element block's E4M3 scale, kept, cached and gathered. Expected values are
restated from the shapes and the datasheets."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from helpers import arch_meaning, run_main

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.costs.arch import Architecture
from ppsim.costs.fp8 import fp8_weight_bytes
from ppsim.costs.layerops import layer_ops
from ppsim.costs.modules import layer_activation_bytes
from ppsim.costs.ops import Roofline, op_times

BF16, FP4 = 2250.0, 9000.0  # dense TFLOP/s of a B200
ELEMENT = 0.5 + 1 / 16
"""Bytes of an NVFP4 element: 4 bits and a 1-byte scale shared by 16."""
GPT = Architecture(num_layers=2, hidden_size=1024, num_heads=8, num_kv_heads=8,
                   ffn_hidden_size=4096, vocab_size=32000, seq_length=2048, gated_mlp=False)
"""A GPT layer small enough to count by hand: 2,048 tokens, h 1,024, a 4h GeLU MLP."""
LINEARS = 1024 * 3072 + 1024 * 1024 + 2 * 1024 * 4096
"""Its four linears' weights: qkv, the output projection, fc1 and fc2."""


def _nvfp4(a: Architecture, **more) -> Architecture:
    return replace(a, **{"fp8": "e2m1", "fp8_recipe": "nvfp4", **more})


def test_an_nvfp4_matmul_runs_at_the_fp4_peak_after_quantizing_its_operands() -> None:
    """Same curve, FP4 peak: each pass takes bf16's time x 2250 / 9000; the forward
    quantizes its m x k input and the backward its m x n output gradient, read in bf16
    and written twice at 9/16 of a byte: 3.125 bytes an element."""
    curve = ((1.0, 0.3), (100.0, 0.7))
    bw = 8000.0  # GB/s: 8e6 bytes a ms
    bare = Roofline(peak_tflops=BF16, fp8_peak_tflops=4500.0, fp4_peak_tflops=FP4,
                    matmul_efficiency=curve)
    qkv = next(op for op in layer_ops(_nvfp4(GPT), "dense") if op.name == "qkv")
    assert qkv.fp8 and qkv.fp4
    f4, b4, w4, *_ = op_times(bare, qkv)
    f16, b16, w16, *_ = op_times(bare, replace(qkv, fp8=False, fp4=False))
    assert (f4, b4, w4) == pytest.approx((f16 / 4, b16 / 4, w16 / 4), rel=1e-12)
    f, b, *_ = op_times(replace(bare, memory_bandwidth_gbps=bw), qkv)
    tokens, h = 2048, 1024
    assert f - f4 == pytest.approx(3.125 * tokens * h / (bw * 1e6))
    assert b - b4 == pytest.approx(3.125 * tokens * 3 * h / (bw * 1e6))


def test_a_device_without_fp4_tensor_cores_refuses_it() -> None:
    from ppsim.errors import UserError

    qkv = layer_ops(_nvfp4(GPT), "dense")[1]
    with pytest.raises(UserError, match="hardware.fp4_peak_tflops"):
        op_times(Roofline(peak_tflops=989.0, fp8_peak_tflops=1979.0), qkv)


def test_linear_inputs_are_kept_in_nvfp4() -> None:
    """No recompute: norm1's and norm2's outputs and the GeLU's output at 9/16 of a byte,
    not 2; the output projection's NVFP4 copy of attention's output besides."""
    kept = 2048 * (1024 + 1024 + 4096) * (2 - ELEMENT) - 2048 * 1024 * ELEMENT
    assert layer_activation_bytes(GPT, "dense") - layer_activation_bytes(_nvfp4(GPT), "dense") \
        == pytest.approx(kept, abs=2)


def test_the_weights_are_cached_in_nvfp4_or_kept_so() -> None:
    """TE caches each NVFP4 weight and its transpose beside the bf16 weight; with
    --fp4-param-gather the two replace the bf16 weight's 2 bytes."""
    a = _nvfp4(GPT)
    ops = layer_ops(a, "dense")
    assert fp8_weight_bytes(a, ops) == pytest.approx(2 * ELEMENT * LINEARS, abs=1)
    kept = _nvfp4(GPT, fp8_param_gather=True, distributed_optimizer=True)
    assert fp8_weight_bytes(kept, ops) == pytest.approx((2 * ELEMENT - 2) * LINEARS, abs=1)


def _arch(line: str) -> Architecture:
    return config_from_args(build_parser().parse_args(["simulate", *shlex.split(line)])) \
        .model.arch  # type: ignore[union-attr]


def test_megatrons_fp4_flags_read_back() -> None:
    line = ("--preset llama3-8b --hardware b200-180gb --use-distributed-optimizer "
            "--fp4-format e2m1 --fp4-param-gather")
    a = _arch(line)
    assert (a.fp8, a.fp8_recipe, a.fp8_param_gather) == ("e2m1", "nvfp4", True)
    args = megatron_model_args(a)
    at = args.index("--fp4-format")
    assert args[at:at + 5] == ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4",
                               "--fp4-param-gather"]
    assert "--fp8-format" not in args
    back = _arch("--hardware b200-180gb " + " ".join(shlex.quote(x) for x in args))
    assert arch_meaning(back) == arch_meaning(a)


JOB = ("--preset llama3-70b --gpus 64 --global-batch-size 256 --micro-batch-size 1 "
       "--seq-length 8192 --tp 2 --pp 4 --vpp 5 --use-distributed-optimizer "
       "--overlap-grad-reduce --overlap-param-gather")


def _throughput(line: str) -> dict:
    code, out, err = run_main(["simulate", *shlex.split(line), "--json"])
    assert code == 0, err
    return json.loads(out)


def test_nvfp4_trains_faster_than_mxfp8_and_counts_the_same_flops() -> None:
    """GB200 (10,000 TFLOP/s dense FP4, 5,000 FP8): the same job in NVFP4 against MXFP8;
    Megatron's FLOP count does not change with the precision."""
    mx = _throughput(f"{JOB} --hardware gb200-186gb --fp8-format e4m3 --fp8-recipe mxfp8 "
                     "--fp8-param-gather")
    nv = _throughput(f"{JOB} --hardware gb200-186gb --fp4-format e2m1 --fp4-param-gather")
    assert nv["iteration_time_ms"] < mx["iteration_time_ms"]
    flops = [d["throughput"]["tflops_per_gpu"] * d["iteration_time_ms"] for d in (mx, nv)]
    assert flops[0] == pytest.approx(flops[1], rel=1e-9)
    peaks = [max(r["peak_memory_bytes"] for r in d["ranks"]) for d in (mx, nv)]
    assert peaks[1] < peaks[0]


@pytest.mark.parametrize("flags, said", [
    ("--hardware h100-80gb --fp4-format e2m1", "model.fp8: NVFP4 (--fp4-format e2m1) needs "
     "FP4 tensor cores"),
    ("--hardware b200-180gb --fp4-format e2m1 --fp8-format hybrid", "--fp4-format and "
     "--fp8-format cannot be used simultaneously"),
    ("--hardware b200-180gb --fp4-param-gather", "--fp4-param-gather must be used together "
     "with --fp4-format"),
    ("--hardware b200-180gb --fp4-format e2m1 --fp4-recipe custom", "--fp4-recipe: 'custom'"),
    ("--hardware b200-180gb --fp4-format e2m1 --fsdp", "model.fsdp: ppsim prices NVFP4"),
    ("--hardware b200-180gb --fp8-format hybrid --fp8-recipe nvfp4",
     "model.fp8_recipe: nvfp4 scales NVFP4's e2m1 elements"),
])
def test_what_megatron_or_ppsim_refuses_is_one_line(flags: str, said: str) -> None:
    code, out, err = run_main(["simulate", "--preset", "llama3-8b", *shlex.split(flags)])
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and said in lines[0], err


@pytest.mark.parametrize("model, hardware, said", [
    ('fp8 = "e2m1"', "", 'model.fp8_recipe: NVFP4 (e2m1) scales by Transformer Engine'),
    ('fp8 = "e2m1"\nfp8_recipe = "nvfp4"', 'fp4_peak_tflops = 1e-9',
     "hardware.fp4_peak_tflops: 1e-09 TFLOP/s is below"),
    ('fp8 = "e2m1"\nfp8_recipe = "nvfp4"', 'fp4_efficiency_ratio = 0',
     "hardware.fp4_efficiency_ratio: must be above 0"),
])
def test_a_bad_nvfp4_field_is_one_line_naming_it(tmp_path, model: str, hardware: str,
                                                 said: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(f'[model]\npreset = "llama3-8b"\n{model}\n'
                    f'[hardware]\npreset = "b200-180gb"\n{hardware}\n')
    code, out, err = run_main(["simulate", "--config", str(path)])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and said in lines[0], err


@pytest.mark.parametrize("precision", ["--fp8-format hybrid --fp8-recipe tensorwise",
                                       "--fp4-format e2m1"])
def test_the_job_plans_megatron_line_keeps_the_precision(precision: str) -> None:
    """`plan --gpus` printed a launch line without the FP8 or FP4 flags it priced: pasted,
    it trained in bf16. Read back on the bare preset it is the planned job again."""
    model = "--preset llama3-8b --num-layers 8 --hardware b200-180gb"
    code, out, err = run_main(["plan", *shlex.split(f"{model} {precision}"), "--gpus", "8",
                               "--global-batch-size", "16", "--time-budget", "2", "--json"])
    assert code == 0, err
    best = json.loads(out)["best"]
    flags = shlex.split(best["megatron_job_flags"])
    assert " ".join(flags).count(precision) == 1
    unless = [] if "--recompute-granularity" in flags else ["--recompute", "none"]
    sim = _throughput(f"{model} --gpus 8 {shlex.join(flags + unless)}")
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-9)


def test_the_executor_refuses_nvfp4_by_its_flag() -> None:
    pytest.importorskip("torch")
    from ppsim.config.presets import MODEL_PRESETS
    from ppsim.errors import UserError
    from ppsim.executor.builders.gpt import build

    fields = {**MODEL_PRESETS["llama3-8b"], "fp8": "e2m1", "fp8_recipe": "nvfp4"}
    with pytest.raises(UserError, match="model.fp8: .*FP4.*--fp4-format"):
        build(fields)


@pytest.mark.parametrize("precision, said", [('fp8 = "e2m1"\nfp8_recipe = "nvfp4"', "NVFP4"),
                                             ('fp8 = "hybrid"', "FP8")])
def test_the_tui_headline_names_the_precision(tmp_path, precision: str, said: str) -> None:
    from ppsim.config.schema import load_config
    from ppsim.tui.headline import throughput_text
    from ppsim.tui.session import evaluate_state, state_from_config

    path = tmp_path / "job.toml"
    path.write_text(f'[model]\npreset = "llama3-8b"\n{precision}\n[pipeline]\npp = 2\n'
                    'microbatches = 8\n[hardware]\npreset = "b200-180gb"\n')
    cfg = load_config(str(path))
    shown = throughput_text(evaluate_state(cfg, state_from_config(cfg)))
    assert shown.split("  ")[-1] == said, shown


@pytest.mark.parametrize(("precision", "element"), [
    ({}, 2.0),
    ({"fp8": "e4m3", "fp8_recipe": "tensorwise"}, 1.0),
    ({"fp8": "e4m3", "fp8_recipe": "mxfp8"}, 1 + 1 / 32),  # was 1: MXFP8's scales left out
    ({"fp8": "e2m1", "fp8_recipe": "nvfp4"}, ELEMENT),
])
def test_zero_bubbles_deferred_weight_gradients_keep_each_formats_copies(
        precision: dict, element: float) -> None:
    """W still needs each linear's input and its output's gradient (tokens x k and tokens
    x n), in the format the matmul quantized them to: one rule with what the forward
    keeps (fp8_bytes), MXFP8's block scales included."""
    from ppsim.costs.transformer import weight_grad_bytes

    a = replace(GPT, **precision)
    ops = layer_ops(a, "dense")
    tokens, h, f = 2048, 1024, 4096
    inputs = tokens * (h + h + h + f)  # qkv, the projection, fc1, fc2: their k
    grads = tokens * (3 * h + h + f + h)  # their n
    assert weight_grad_bytes(a, ops, inputs=True) == pytest.approx(element * inputs, abs=1)
    assert weight_grad_bytes(a, ops, inputs=False) == pytest.approx(element * grads, abs=1)
