"""FP8 on a hybrid stack (--fp8-format beside --hybrid-layer-pattern): Megatron builds a
Mamba or GatedDeltaNet mixer's in_proj and out_proj as Transformer Engine linears
(TELayerNormColumnParallelLinear, TERowParallelLinear in hybrid_layer_specs.py), so they
run in FP8 as a decoder layer's linears do; the conv, the scan and the gated norm stay
in bf16. Expected values are restated from the shapes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ppsim.cli.main import main
from ppsim.config.model import parse_model
from ppsim.config.schema import config_from_dict
from ppsim.costs.mixers import mixer_activation_bytes, mixer_ops
from ppsim.costs.transformer import accelerator, transformer_costs

NANO = parse_model({"preset": "nemotron-3-nano-30b-a3b"}).arch  # type: ignore[union-attr]
NEXT = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]
ACC = accelerator(config_from_dict({"model": {"preset": "llama3-8b"},
                                     "hardware": {"preset": "h100-80gb"}}).hardware)


def _fp8(a, **more):
    return replace(a, fp8="hybrid", fp8_recipe="tensorwise", **more)


@pytest.mark.parametrize("arch, kind, linears", [
    (NANO, "mamba", {"mamba.in_proj", "mamba.out_proj"}),
    (NEXT, "gdn", {"gdn.in_proj", "gdn.out_proj"}),
    (NANO, "moe-mlp", {"experts.fc1", "experts.fc2", "shared.fc1", "shared.fc2"}),
    (NANO, "attention", {"qkv", "out_proj"}),
])
def test_a_mixers_te_linears_run_in_fp8_and_nothing_else(arch, kind, linears) -> None:
    assert {op.name for op in mixer_ops(_fp8(arch), kind) if op.fp8} == linears
    assert not any(op.fp8 for op in mixer_ops(arch, kind))


def test_a_mamba_layer_is_faster_in_fp8_by_its_projections_alone() -> None:
    """Only in_proj and out_proj change; each FP8 pass is at most bf16's (the FP8 peak is
    twice bf16's, less the quantization and the efficiency ratio)."""
    bf16 = transformer_costs(replace(NANO, recompute="none"), ACC)
    fp8 = transformer_costs(_fp8(replace(NANO, recompute="none")), ACC)
    at = bf16.kinds.index("mamba")
    assert fp8.layers[at].forward_ms < bf16.layers[at].forward_ms
    assert fp8.layers[at].backward_ms < bf16.layers[at].backward_ms
    for kind in ("mamba", "gdn"):
        arch = NANO if kind == "mamba" else NEXT
        plain = {op.name: op for op in mixer_ops(arch, kind)}
        for op in mixer_ops(_fp8(arch), kind):
            assert op.fp8 or op == plain[op.name]


@pytest.mark.parametrize("arch, kind", [(NANO, "mamba"), (NEXT, "gdn")])
def test_an_fp8_mixer_keeps_its_projections_inputs_in_one_byte(arch, kind) -> None:
    """in_proj's input (the pre-norm's output, h wide) and out_proj's (the gated norm's
    output: d_inner = heads x head_dim for Mamba, value heads x value width for GDN) are
    kept in FP8, 1 byte for bf16's 2; everything else as in bf16."""
    a = replace(arch, tp=2, recompute="none")
    tokens = a.seq_length * a.micro_batch_size
    if kind == "mamba":
        out_in = a.mamba_num_heads * a.mamba_head_dim
    else:
        out_in = a.linear_num_value_heads * a.linear_value_head_dim
    saved = tokens * (a.hidden_size + out_in) * (2 - 1) / a.tp
    assert mixer_activation_bytes(a, kind) - mixer_activation_bytes(_fp8(a), kind) \
        == pytest.approx(saved, abs=1)


def test_te_caches_the_fp8_projections_weights_unless_they_are_gathered_in_fp8() -> None:
    """2 bytes a parameter of in_proj and out_proj (the FP8 weight and its transpose);
    none with --fp8-param-gather, where the FP8 weight takes the bf16 copy's place."""
    a = replace(NANO, tp=2, recompute="none")
    inner = a.mamba_num_heads * a.mamba_head_dim
    in_proj = 2 * inner + 2 * a.mamba_num_groups * a.mamba_state_dim + a.mamba_num_heads
    weights = (a.hidden_size * in_proj + inner * a.hidden_size) / a.tp
    at = transformer_costs(a, ACC).kinds.index("mamba")
    bf16 = transformer_costs(a, ACC).layers[at].static_bytes
    assert transformer_costs(_fp8(a), ACC).layers[at].static_bytes - bf16 \
        == pytest.approx(2 * weights, abs=1)
    gathered = _fp8(a, fp8_param_gather=True, distributed_optimizer=True)
    assert transformer_costs(gathered, ACC).layers[at].static_bytes \
        == transformer_costs(replace(a, distributed_optimizer=True), ACC).layers[at].static_bytes


def test_first_last_layers_bf16_keeps_a_hybrid_stacks_ends_in_bf16() -> None:
    """By global index, as Megatron's is_first_last_bf16_layer: Nano's first layer (a
    Mamba) and last (a MoE block) are priced as in bf16, the second Mamba in FP8."""
    bf16 = transformer_costs(NANO, ACC)
    ends = transformer_costs(_fp8(NANO, first_last_layers_bf16=True,
                                  num_layers_at_start_in_bf16=1,
                                  num_layers_at_end_in_bf16=1), ACC)
    kinds = bf16.kinds
    assert kinds[0] == kinds[2] == "mamba" and kinds[NANO.num_layers - 1] == "moe-mlp"
    assert ends.layers[0] == bf16.layers[0]
    assert ends.layers[NANO.num_layers - 1] == bf16.layers[NANO.num_layers - 1]
    assert ends.layers[2].forward_ms < bf16.layers[2].forward_ms


def _simulate(capsys, *flags: str) -> dict:
    assert main(["simulate", "--preset", "nemotron-3-nano-30b-a3b", "--hardware",
                 "h100-80gb", "--pp", "1", "--ep", "8", "--gpus", "16",
                 "--global-batch-size", "256", "--use-distributed-optimizer",
                 *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_hybrid_job_in_fp8_is_priced_faster_with_the_same_flop_count(capsys) -> None:
    bf16 = _simulate(capsys)
    fp8 = _simulate(capsys, "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                    "--fp8-param-gather")
    assert fp8["job"]["fp8"] == {"format": "hybrid", "recipe": "tensorwise",
                                 "param_gather": True}
    assert fp8["iteration_time_ms"] < bf16["iteration_time_ms"]
    per_token = [r["throughput"]["tflops_per_gpu"] / r["throughput"]["tokens_per_s_per_gpu"]
                 for r in (bf16, fp8)]
    assert per_token[0] == pytest.approx(per_token[1], rel=1e-9)


@pytest.mark.parametrize("flags, message", [
    (["--preset", "nemotron-h-8b", "--mamba-num-heads", "136"],
     "model.mamba_num_heads: For FP8, the innermost dimension of the Mamba layer input "
     "projection output tensor must be a multiple of 16 (it is 19592)"),
    (["--preset", "qwen3-next-80b-a3b", "--linear-num-key-heads", "4",
      "--linear-num-value-heads", "36"],
     "model.linear_num_value_heads: For FP8, the innermost dimension of the GDN layer input "
     "projection output tensor must be a multiple of 16 (it is 10312)"),
])
def test_a_mixer_fp8_cannot_run_is_refused_in_megatrons_words(capsys, flags, message) -> None:
    """MambaMixer and GatedDeltaNet assert their in_proj width divides by 16 under FP8:
    Mamba 2 x 136 x 64 + 2 x 8 x 128 + 136 = 19,592; GDN 2 x 4 x 128 + 2 x 36 x 128 + 2 x 36
    = 10,312. In bf16 both run."""
    assert main(["simulate", *flags]) == 0
    capsys.readouterr()
    assert main(["simulate", *flags, "--fp8-format", "hybrid"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_mxfp8_needs_the_mixers_widths_in_blocks_of_32(capsys) -> None:
    """Megatron's get_fp8_align_size: 32 under mxfp8, 16 otherwise. 144 Mamba heads make
    an in_proj of 2 x 144 x 64 + 2 x 8 x 128 + 144 = 20,624: 16 divides it, 32 does not."""
    flags = ["simulate", "--preset", "nemotron-h-8b", "--mamba-num-heads", "144",
             "--hardware", "b200-180gb", "--fp8-format", "hybrid"]
    assert main([*flags, "--fp8-recipe", "tensorwise"]) == 0
    capsys.readouterr()
    assert main([*flags, "--fp8-recipe", "mxfp8"]) == 2
    assert "must be a multiple of 32 (it is 20624)" in capsys.readouterr().err
