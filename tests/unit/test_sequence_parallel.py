"""Tensor parallelism with and without sequence parallelism (Megatron's --sequence-parallel):
the activations between the tensor-parallel blocks, the collectives, the pipeline's
messages, and Megatron's refusals, against closed forms restated here (Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.2.2: per
layer sbh(10 + 24/t + 5as/(ht)) without sequence parallelism, sbh/t (34 + 5as/h) with it;
H100 preset: NVLink 450 GB/s each way, 1 us a ring step)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from ppsim.cli.main import main
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.schema import config_from_dict
from ppsim.costs.kinds import gathered_gemm_windows, head_gemm_window
from ppsim.costs.modules import layer_activation_bytes
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.collectives import behind_compute_ms
from ppsim.pipeline.problem import model_costs

NV, NV_STEP = 450e6, 1e-3  # bytes per ms, ms


def cfg(model: dict, pipe: dict | None = None):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, **model},
                             "pipeline": {"pp": 1, "microbatches": 4, **(pipe or {})},
                             "hardware": {"preset": "h100-80gb"}})


def gpt(tp: int, sp: bool, **over):
    """GPT-3 1.3B's layer (LayerNorm, a GeLU MLP) with dropout, as Korthikanti counts it."""
    c = config_from_dict({"model": {"preset": "gpt3-1.3b", "tp": tp, "sequence_parallel": sp,
                                    "dropout": True, "recompute": "none", **over}})
    return c.model.arch


def all_reduce(nbytes: float, n: int) -> float:
    """NCCL's cheaper of ring and double binary tree (the tree at half the bus bandwidth)."""
    ring = 2 * (n - 1) * NV_STEP + 2 * (n - 1) / n * nbytes / NV
    tree = 2 * math.ceil(math.log2(n)) * NV_STEP + 2 * (n - 1) / n * nbytes / (NV / 2)
    return min(ring, tree)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_activations_between_the_blocks_are_whole_on_every_tensor_rank(tp: int) -> None:
    split, whole = gpt(tp, True), gpt(tp, False)
    s, b, h = split.seq_length, split.micro_batch_size, split.hidden_size
    # Korthikanti's 10 sbh the tensor ranks each keep whole without sequence parallelism:
    # both norms' inputs (2 x 2sbh), their outputs, the QKV and first MLP linears' inputs
    # (2 x 2sbh), both dropout masks (2 x sbh); and LayerNorm's fp32 mean and rstd.
    between = 10 * s * b * h + 2 * 8 * s * b
    got = layer_activation_bytes(whole, "dense") - layer_activation_bytes(split, "dense")
    assert got == pytest.approx(between * (1 - 1 / tp), abs=2)
    # At tp 1 Megatron turns sequence parallelism off: nothing changes.
    assert layer_activation_bytes(gpt(1, False), "dense") \
        == layer_activation_bytes(gpt(1, True), "dense")


def test_full_recompute_keeps_the_layer_input_whole() -> None:
    split, whole = gpt(4, True, recompute="full"), gpt(4, False, recompute="full")
    s, b, h = split.seq_length, split.micro_batch_size, split.hidden_size
    assert layer_activation_bytes(split, "dense") == 2 * s * b * h // 4
    assert layer_activation_bytes(whole, "dense") == 2 * s * b * h


def test_a_hybrid_layer_keeps_its_pre_norm_whole() -> None:
    c = config_from_dict({"model": {"preset": "nemotron-h-8b", "tp": 4}})
    split, whole = c.model.arch, replace(c.model.arch, sequence_parallel=False)
    s, b, h = split.seq_length, split.micro_batch_size, split.hidden_size
    sp, no_sp = (transformer_costs(a, accelerator(c.hardware)) for a in (split, whole))
    kinds = sp.kinds
    mamba = kinds.index("mamba")
    # RMSNorm: its input and output (bf16) and its fp32 rstd, no dropout
    between = (2 * 2 * h + 4) * s * b
    got = no_sp.layers[mamba].activation_bytes - sp.layers[mamba].activation_bytes
    assert got == pytest.approx(between * 3 / 4, abs=2)


def test_without_sequence_parallelism_each_block_all_reduces() -> None:
    tp, hidden = 4, 8192 * 4096 * 2  # one microbatch's hidden states, bf16
    c = cfg({"tp": tp, "sequence_parallel": False})
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    got = model_costs(c)
    ar = all_reduce(hidden, tp)
    # attention's and the MLP's row-parallel outputs forward, their column-parallel
    # inputs' gradients backward, each async beside its weight-gradient GEMM (the QKV
    # projection's, fc1's), slowing it by NCCL's 16 of the H100's 132 SMs
    r, share = accelerator(c.hardware).roofline(), 16 / 132
    beside = sum(behind_compute_ms(ar, w.weight_grad_ms, share)
                 for w in gathered_gemm_windows(c.model.arch, r, "dense"))
    assert got.layers[0].forward_ms == pytest.approx(alone.layers[0].forward_ms + 2 * ar)
    assert got.layers[0].backward_ms == pytest.approx(alone.layers[0].backward_ms + beside)
    # the embedding all-reduces its output, the head its input's gradient (beside its own)
    assert got.embedding.forward_ms == pytest.approx(alone.embedding.forward_ms + ar)
    assert got.embedding.backward_ms == pytest.approx(alone.embedding.backward_ms)
    assert got.head.forward_ms == pytest.approx(alone.head.forward_ms)
    head = head_gemm_window(c.model.arch, r).weight_grad_ms
    assert got.head.backward_ms == pytest.approx(
        alone.head.backward_ms + behind_compute_ms(ar, head, share))
    # full recompute runs the forward's all-reduces again in the backward, synchronously
    full = cfg({"tp": tp, "sequence_parallel": False, "recompute": "full"})
    alone_full = transformer_costs(full.model.arch, accelerator(full.hardware))
    assert model_costs(full).layers[0].backward_ms == pytest.approx(
        alone_full.layers[0].backward_ms + 2 * ar + beside)


def test_the_norms_and_residuals_run_whole_on_every_tensor_rank() -> None:
    split, whole = (transformer_costs(cfg({"tp": 8, "sequence_parallel": sp}).model.arch,
                                      accelerator(cfg({}).hardware)) for sp in (True, False))
    assert whole.layers[0].forward_ms > split.layers[0].forward_ms
    # the pipeline sends whole hidden states from every tensor rank
    assert whole.layers[0].output_bytes == 8 * split.layers[0].output_bytes
    assert whole.embedding.output_bytes == 8 * split.embedding.output_bytes


def test_megatron_line_says_what_was_priced() -> None:
    on = " ".join(megatron_model_args(cfg({"tp": 4}).model.arch))
    off = " ".join(megatron_model_args(cfg({"tp": 4, "sequence_parallel": False}).model.arch))
    assert "--tensor-model-parallel-size 4 --sequence-parallel" in on
    assert "--tensor-model-parallel-size 4" in off and "--sequence-parallel" not in off


MODEL = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16",
         "--seq-length", "2048", "--max-position-embeddings", "2048", "--vocab-size",
         "32000", "--bf16", "--tp", "2", "--pp", "2", "--hardware", "h100-80gb", "--json"]


def _peak(capsys: pytest.CaptureFixture, *extra: str) -> float:
    assert main(["simulate", *MODEL, *extra]) == 0
    return max(r["peak_memory_bytes"] for r in json.loads(capsys.readouterr().out)["ranks"])


def test_a_model_from_megatron_flags_has_sequence_parallelism_only_when_asked(
        capsys: pytest.CaptureFixture) -> None:
    # Megatron's default is off: its line without the flag keeps more on each rank.
    assert _peak(capsys) > _peak(capsys, "--sequence-parallel")


@pytest.mark.parametrize("argv, field", [
    (["--preset", "qwen3-30b-a3b", "--tp", "2", "--no-sequence-parallel"],
     "model.sequence_parallel"),
    (["--preset", "llama3-8b", "--tp", "2", "--no-sequence-parallel", "--tp-comm-overlap"],
     "pipeline.tp_comm_overlap"),
    (MODEL[:-1] + ["--tp-comm-overlap"], "pipeline.tp_comm_overlap"),
])
def test_megatron_refusals(argv: list[str], field: str,
                           capsys: pytest.CaptureFixture) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert field in err and "sequence parallelism" in err and "Traceback" not in err


def test_the_job_says_which_way_it_was_priced(capsys: pytest.CaptureFixture) -> None:
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp", "2"]
    assert main([*base, "--no-sequence-parallel"]) == 0
    assert "tp 2 (no sequence parallelism)" in " ".join(capsys.readouterr().out.split())
    for extra, want in (([], True), (["--no-sequence-parallel"], False)):
        assert main([*base, *extra, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["job"]["sequence_parallel"] is want


def test_beside_learned_positions_the_embedding_all_reduces_then_splits() -> None:
    """Megatron's LanguageModelEmbedding reduce-scatters the words' lookup only without
    position embeddings; beside them it all-reduces, adds them, then takes this rank's
    tokens (an all-gather back in the backward)."""
    tp = 4
    c = config_from_dict({"model": {"preset": "gpt3-1.3b", "num_layers": 2, "tp": tp},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    a = c.model.arch
    hidden = a.seq_length * a.micro_batch_size * a.hidden_size * 2
    gather = 3 * NV_STEP + 3 / 4 * hidden / NV
    alone = transformer_costs(a, accelerator(c.hardware))
    got = model_costs(c)
    assert got.embedding.forward_ms == pytest.approx(alone.embedding.forward_ms
                                                     + all_reduce(hidden, tp))
    assert got.embedding.backward_ms == pytest.approx(alone.embedding.backward_ms + gather)
    # the head gathers its input either way
    assert got.head.forward_ms == pytest.approx(alone.head.forward_ms + gather)


@pytest.mark.parametrize("flags, want", [
    (["--tp", "4"], True),  # ppsim's name: the config's (on by default)
    (["--tensor-model-parallel-size", "4"], False),  # Megatron's line: Megatron's default
    (["--tensor-model-parallel-size", "4", "--sequence-parallel"], True),
    (["--tp", "4", "--no-sequence-parallel"], False),
])
def test_a_megatron_line_over_a_preset_is_read_as_megatron_reads_it(
        flags: list[str], want: bool, capsys: pytest.CaptureFixture) -> None:
    assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", *flags,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["sequence_parallel"] is want
