"""FP8 as Megatron runs it with Transformer Engine (--fp8-format, ppsim.costs.fp8): the
decoder layers' TE linears at the FP8 peak, their operands quantized, their inputs kept
in FP8, the FP8 weights cached (or gathered in FP8 with --fp8-param-gather), the
sequence-parallel gathers in FP8. Expected values are restated from the shapes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ppsim.cli.main import main
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.presets import HARDWARE_PRESETS, MODEL_PRESETS
from ppsim.config.schema import HardwareConfig, config_from_dict
from ppsim.costs.arch import Architecture
from ppsim.costs.kinds import gathered_gemm_windows
from ppsim.costs.layerops import head_ops, layer_ops
from ppsim.costs.modules import layer_activation_bytes
from ppsim.costs.ops import Roofline, op_times
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.errors import UserError
from ppsim.executor.builders.gpt import build
from ppsim.job.collectives import behind_compute_ms
from ppsim.pipeline.problem import build_problem, model_costs
from ppsim.sim.simulate import simulate

NV, NV_STEP, NIC, NIC_STEP = 450e6, 1e-3, 50e6, 5e-3  # bytes per ms, ms (h100-80gb)
BF16, FP8 = 989.0, 1979.0
# A GPT layer small enough to count by hand: 2,048 tokens, h 1,024, a 4h GeLU MLP.
GPT = Architecture(num_layers=2, hidden_size=1024, num_heads=8, num_kv_heads=8,
                   ffn_hidden_size=4096, vocab_size=32000, seq_length=2048, gated_mlp=False)


def cfg(model: dict, pipe: dict | None = None, hw: dict | None = None):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, **model},
                             "pipeline": {"pp": 1, "microbatches": 4, **(pipe or {})},
                             "hardware": {"preset": "h100-80gb", **(hw or {})}})


def _fp8(a: Architecture, **more) -> Architecture:
    return replace(a, **{"fp8": "hybrid", **more})


def test_the_te_linears_are_fp8_and_the_rest_bf16() -> None:
    """DeepSeek-V3's MoE layer: MLA's four projections, the output projection, the routed
    and shared experts; not the router, the attention core or the output layer."""
    a = _fp8(Architecture(**MODEL_PRESETS["deepseek-v3"]))
    fp8 = {op.name for op in layer_ops(a, "moe") if op.fp8}
    assert fp8 == {"q_down", "q_up", "kv_down", "kv_up", "out_proj", "experts.fc1",
                   "experts.fc2", "shared.fc1", "shared.fc2"}
    assert not any(op.fp8 for op in head_ops(a))
    assert not any(op.fp8 for op in layer_ops(replace(a, fp8=""), "moe"))


def test_an_fp8_matmul_runs_at_the_fp8_peak_after_quantizing_its_operands() -> None:
    """Same curve, FP8 peak: each pass takes bf16's time x 989 / 1979; the forward
    quantizes its m x k input and the backward its m x n output gradient, 4 bytes an
    element (read 2, write the FP8 copy and its transpose)."""
    curve = ((1.0, 0.3), (100.0, 0.7))
    bw = 3000.0  # GB/s: 3e6 bytes a ms
    bare = Roofline(peak_tflops=BF16, fp8_peak_tflops=FP8, matmul_efficiency=curve)
    roof = replace(bare, memory_bandwidth_gbps=bw)
    qkv = next(op for op in layer_ops(_fp8(GPT), "dense") if op.name == "qkv")
    plain = replace(qkv, fp8=False)
    f8, b8, w8, *_ = op_times(bare, qkv)
    f16, b16, w16, *_ = op_times(bare, plain)
    assert (f8, b8, w8) == pytest.approx((f16 * BF16 / FP8, b16 * BF16 / FP8,
                                          w16 * BF16 / FP8), rel=1e-12)
    tokens, h = 2048, 1024
    f, b, *_ = op_times(roof, qkv)
    assert f - f8 == pytest.approx(4 * tokens * h / (bw * 1e6))
    assert b - b8 == pytest.approx(4 * tokens * 3 * h / (bw * 1e6))


def test_the_hopper_presets_price_fp8_at_the_measured_share_of_bf16s_efficiency() -> None:
    """bench_fp8_gemm.py on an H200 (2026-12-04): FP8 reached 0.87-0.95 of bf16's share
    of peak at the Llama 3 linears' shapes, mean 0.915; both Hopper presets carry 0.92,
    and a layer's FP8 GEMMs there take bf16's time x 989 / (1979 x 0.92)."""
    for name in ("h100-80gb", "h200-141gb"):
        roof = accelerator(HardwareConfig(**HARDWARE_PRESETS[name])).roofline()
        assert roof.fp8_efficiency_ratio == 0.92
        qkv = next(op for op in layer_ops(_fp8(GPT), "dense") if op.name == "qkv")
        bare = replace(roof, memory_bandwidth_gbps=0.0)
        f8 = op_times(bare, qkv)[0]
        f16 = op_times(bare, replace(qkv, fp8=False))[0]
        assert f8 == pytest.approx(f16 * 989.0 / (1979.0 * 0.92), rel=1e-12)


def test_a_device_without_fp8_refuses_fp8(capsys) -> None:
    with pytest.raises(UserError, match="hardware.fp8_peak_tflops"):
        op_times(Roofline(peak_tflops=312.0), layer_ops(_fp8(GPT), "dense")[1])


def test_linear_inputs_are_kept_in_fp8_and_attentions_output_twice() -> None:
    """GPT layer, no recompute: norm1's and norm2's outputs and the GeLU's output (fc2's
    input) at 1 byte, not 2: 2,048 x (1,024 + 1,024 + 4,096) bytes less; the output
    projection's FP8 copy of attention's output, 2,048 x 1,024 bytes more."""
    saved = 2048 * (1024 + 1024 + 4096) - 2048 * 1024
    assert layer_activation_bytes(GPT, "dense") - layer_activation_bytes(_fp8(GPT), "dense") \
        == saved
    # tp 2 (sequence parallel): every tensor is split, so is the difference
    assert layer_activation_bytes(replace(GPT, tp=2), "dense") \
        - layer_activation_bytes(_fp8(GPT, tp=2), "dense") == saved // 2
    # Recomputed attention frees FlashAttention's bf16 output too (2 bytes an element):
    # the projection keeps its FP8 copy.
    sel = replace(GPT, recompute="selective")
    assert layer_activation_bytes(sel, "dense") - layer_activation_bytes(_fp8(sel), "dense") \
        == saved + 2048 * 1024 * 2


def test_the_first_and_last_layers_in_bf16_cost_as_bf16_layers() -> None:
    """--first-last-layers-bf16 with 2 at the start and 1 at the end: layers 0, 1 and 7 of
    8 cost what the bf16 model's do, weights included; the rest what the FP8 model's do."""
    acc = accelerator(cfg({}).hardware)
    a = replace(GPT, num_layers=8)
    bf16, fp8 = (transformer_costs(x, acc).layers[0] for x in (a, _fp8(a)))
    mixed = transformer_costs(_fp8(a, fp8_recipe="tensorwise", first_last_layers_bf16=True,
                                   num_layers_at_start_in_bf16=2,
                                   num_layers_at_end_in_bf16=1), acc).layers
    assert [c == bf16 for c in mixed] == [True, True, False, False, False, False, False, True]
    assert all(c == fp8 for c in mixed[2:7])


def test_fp8_weights_are_cached_beside_the_bf16_ones_unless_gathered_in_fp8() -> None:
    """2 bytes (the FP8 weight and its transpose) a parameter of the layer's linears:
    qkv 1,024 x 3,072, proj 1,024 x 1,024, fc1 and fc2 1,024 x 4,096 each; none with
    --fp8-param-gather, where the FP8 weight and its transpose replace the bf16 one."""
    acc = accelerator(cfg({}).hardware)
    linears = 1024 * 3072 + 1024 * 1024 + 2 * 1024 * 4096

    def static(a: Architecture) -> int:
        return transformer_costs(a, acc).layers[0].static_bytes

    assert static(_fp8(GPT)) - static(GPT) == 2 * linears
    opt = replace(GPT, distributed_optimizer=True, dp=4)
    assert static(_fp8(opt, fp8_param_gather=True)) == static(opt)


def test_sequence_parallel_gathers_the_quantized_input() -> None:
    """tp 4 in a node: the forward's two all-gathers move 1 byte an element, its two
    reduce-scatters and the backward's gradient collectives 2, and the backward's
    gathers of the inputs again (for the weight gradients) 1, as TE gathers the
    quantized copy it saved."""
    c = cfg({"tp": 4, "fp8": "hybrid"})
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    s = 8192 * 4096  # one microbatch's hidden states, elements

    def one(nbytes: float) -> float:
        return 3 * NV_STEP + 3 / 4 * nbytes / NV

    got = model_costs(c).layers[0]
    assert got.forward_ms == pytest.approx(alone.layers[0].forward_ms + 2 * one(s)
                                           + 2 * one(2 * s))
    # the gathers again beside the FP8 input-gradient GEMMs of the QKV projection and
    # fc1, the scatters beside their FP8 weight-gradient GEMMs; NCCL's 16 of 132 SMs
    windows = gathered_gemm_windows(c.model.arch, accelerator(c.hardware).roofline(),
                                    "dense")
    beside = sum(behind_compute_ms(one(s), w.input_grad_ms, 16 / 132)
                 + behind_compute_ms(one(2 * s), w.weight_grad_ms, 16 / 132)
                 for w in windows)
    assert got.backward_ms == pytest.approx(alone.layers[0].backward_ms + 2 * one(2 * s)
                                            + beside)


def test_a_bf16_first_layer_gathers_in_bf16() -> None:
    """With the first and last of 4 layers in bf16, their forward all-gathers move 2 bytes
    an element and the middle layers' 1: the bf16 layers cost the bf16 job's layers."""
    keep = {"fp8_recipe": "tensorwise", "first_last_layers_bf16": True}
    mixed = model_costs(cfg({"tp": 4, "fp8": "hybrid", **keep})).layers
    bf16 = model_costs(cfg({"tp": 4})).layers[0]
    fp8 = model_costs(cfg({"tp": 4, "fp8": "hybrid", "fp8_recipe": "tensorwise"})).layers[0]
    assert [mixed[0], mixed[3]] == [bf16, bf16]
    assert [mixed[1], mixed[2]] == [fp8, fp8]


def test_fp8_param_gather_gathers_the_layers_in_fp8_and_the_embedding_in_bf16() -> None:
    """pp 2, dp 16, both overlaps: rank 0's exposed bucket is the embedding's (bf16:
    fp32 gradients reduce-scattered, bf16 weights gathered, 4 + 2 bytes); rank 1, which
    Megatron does not bucket, waits on all its gradients, its layers gathered in FP8
    (4 + 1) and its output layer in bf16 (4 + 2)."""
    problem = build_problem(cfg({"dp": 16, "distributed_optimizer": True, "fp8": "hybrid",
                                 "fp8_param_gather": True},
                                {"pp": 2, "overlap_grad_reduce": True,
                                 "overlap_param_gather": True},
                                {"collective_sms": 0}))  # the exposed bucket alone
    reduce = [r for _, r, _ in simulate(problem).timeline.step]
    bus = min(NV, 8 * NIC)

    def rs_ag(n: float, weight_bytes: int) -> float:
        return 2 * 15 * NIC_STEP + 15 / 16 * n * (4 + weight_bytes) / bus

    assert reduce[0] == pytest.approx(rs_ag(128256 * 4096, 2), rel=1e-9)
    head = 128256 * 4096
    layers = problem.stage_costs[1].params - head
    assert reduce[1] == pytest.approx(rs_ag(layers, 1) + rs_ag(head, 2) - 2 * 15 * NIC_STEP,
                                      rel=1e-9)


def test_fp8_speeds_the_step_and_leaves_the_flop_count(capsys) -> None:
    argv = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--num-layers",
            "4", "--pp", "2", "--microbatches", "4", "--gpus", "16", "--json"]
    runs = []
    for extra in ([], ["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"]):
        assert main([*argv, *extra]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    bf16, fp8 = (r["throughput"] for r in runs)
    assert runs[0]["job"]["fp8"] is None
    assert runs[1]["job"]["fp8"] == {"format": "hybrid", "recipe": "blockwise",
                                     "param_gather": False}
    assert fp8["tflops_per_gpu"] > bf16["tflops_per_gpu"]
    ratio = runs[0]["iteration_time_ms"] / runs[1]["iteration_time_ms"]
    assert fp8["tflops_per_gpu"] / bf16["tflops_per_gpu"] == pytest.approx(ratio, rel=1e-9)


def test_the_job_line_says_fp8(capsys) -> None:
    assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                 "--num-layers", "4", "--gpus", "8", "--fp8-format", "e4m3"]) == 0
    assert "global batch 32, FP8 e4m3 delayed:" in " ".join(capsys.readouterr().out.split())


def test_the_model_as_megatron_arguments_says_fp8() -> None:
    a = _fp8(replace(GPT, dtype="bf16", distributed_optimizer=True), fp8="e4m3",
             fp8_recipe="tensorwise", fp8_param_gather=True)
    line = " ".join(megatron_model_args(a))
    assert "--bf16 --fp8-format e4m3 --fp8-recipe tensorwise --fp8-param-gather" in line
    assert "--fp8" not in " ".join(megatron_model_args(GPT))


def test_the_executor_refuses_fp8() -> None:
    fields = {**MODEL_PRESETS["llama3-8b"], "fp8": "hybrid"}
    with pytest.raises(UserError, match="model.fp8"):
        build(fields)


@pytest.mark.parametrize("model, hardware, message", [
    ('fp8 = 1', '', 'model.fp8: unknown value 1 (use "" | e4m3 | hybrid | e2m1)'),
    ('fp8 = "hybrid"\nfp8_recipe = 3', '', "model.fp8_recipe: 3 is not priced"),
    ('fp8 = "hybrid"\nfp8_param_gather = "yes"', '', "model.fp8_param_gather: expected bool"),
    ('fp8 = "hybrid"', 'fp8_peak_tflops = nan', "hardware.fp8_peak_tflops: must be a finite"),
    ('fp8 = "hybrid"', 'fp8_peak_tflops = 0', "hardware.fp8_peak_tflops: is 0"),
    ('', 'fp8_peak_tflops = -1', "hardware.fp8_peak_tflops: must be at least 0"),
    ('', 'fp8_peak_tflops = 1e-9', "hardware.fp8_peak_tflops: 1e-09 TFLOP/s is below"),
    ('fp8 = "hybrid"', 'fp8_efficiency_ratio = 0', "hardware.fp8_efficiency_ratio: must be "
     "above 0 and at most 2"),
])
def test_a_bad_fp8_field_is_one_line_naming_it(tmp_path, capsys, model: str, hardware: str,
                                                message: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(f'[model]\npreset = "llama3-8b"\n{model}\n'
                    f'[hardware]\npreset = "h100-80gb"\n{hardware}\n')
    assert main(["simulate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_mxfp8_keeps_a_scale_byte_a_block_on_blackwell_alone() -> None:
    """--fp8-recipe mxfp8 (Blackwell's MXFP8BlockScaling; refused as unpriced before): the
    FP8 linears' kept inputs and cached weights as the other recipes keep them, plus one
    E8M0 scale byte for each 32 elements; it needs MX-capable tensor cores."""
    fp8 = _fp8(GPT, fp8_recipe="tensorwise")
    mx = _fp8(GPT, fp8_recipe="mxfp8")
    inputs = 2048 * (1024 + 1024 + 4096) + 2048 * 1024  # norm1, norm2, GeLU out, attn copy
    assert layer_activation_bytes(mx, "dense") - layer_activation_bytes(fp8, "dense") \
        == pytest.approx(inputs / 32, abs=1)
    acc = accelerator(cfg({}, hw={"preset": "b200-180gb"}).hardware)
    linears = 1024 * 3072 + 1024 * 1024 + 2 * 1024 * 4096
    assert transformer_costs(mx, acc).layers[0].static_bytes \
        - transformer_costs(fp8, acc).layers[0].static_bytes == pytest.approx(
            2 * linears / 32, abs=1)
    # The GEMMs run at the FP8 rate either way.
    assert transformer_costs(mx, acc).layers[0].forward_ms == pytest.approx(
        transformer_costs(fp8, acc).layers[0].forward_ms)
    ok = cfg({"fp8": "hybrid", "fp8_recipe": "mxfp8"}, hw={"preset": "b200-180gb"})
    assert ok.model.arch.fp8_recipe == "mxfp8"
    with pytest.raises(UserError) as err:
        build_problem(cfg({"fp8": "hybrid", "fp8_recipe": "mxfp8"}))  # an H100
    assert err.value.field == "model.fp8_recipe" and "MX formats" in str(err.value)


def test_mxfp8_weights_gathered_in_fp8_keep_their_scales() -> None:
    """--fp8-param-gather under MXFP8: the weight and its transpose take the bf16 weight's
    2 bytes and a scale byte per 32 elements each (priced as nothing beyond bf16 before)."""
    from ppsim.costs.fp8 import fp8_weight_bytes

    mx = _fp8(GPT, fp8_recipe="mxfp8", fp8_param_gather=True, distributed_optimizer=True)
    linears = 1024 * 3072 + 1024 * 1024 + 2 * 1024 * 4096
    assert fp8_weight_bytes(mx, layer_ops(mx, "dense")) == pytest.approx(2 * linears / 32, abs=1)
    tensorwise = replace(mx, fp8_recipe="tensorwise")
    assert fp8_weight_bytes(tensorwise, layer_ops(tensorwise, "dense")) == 0
