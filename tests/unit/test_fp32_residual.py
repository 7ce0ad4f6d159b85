"""Megatron's --fp32-residual-connection: the residual stream in fp32 between the sublayers
(TransformerLayer casts the residual to float, the bias-dropout-add writes fp32, the
pipeline's dtype becomes fp32), against closed forms restated here."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.schema import config_from_dict
from ppsim.costs.layerops import layer_ops
from ppsim.costs.modules import layer_activation_bytes
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.executor import launch


def gpt(fp32: bool, tp: int = 1, **over):
    """GPT-3 1.3B in bf16 with dropout."""
    return config_from_dict({"model": {"preset": "gpt3-1.3b", "tp": tp, "dtype": "bf16",
                                       "fp32_residual": fp32, "dropout": True,
                                       "recompute": "none", **over},
                             "hardware": {"preset": "h100-80gb"}})


@pytest.mark.parametrize("tp", [1, 4])
def test_the_norms_keep_fp32_inputs(tp: int) -> None:
    a, b = gpt(False, tp).model.arch, gpt(True, tp).model.arch
    s, mb, h = a.seq_length, a.micro_batch_size, a.hidden_size
    # both norms' inputs (the residual stream) at 4 bytes an element, not 2; sequence
    # parallel: 1 / tp each
    extra = 2 * s * mb * h * (4 - 2) / tp
    assert layer_activation_bytes(b, "dense") - layer_activation_bytes(a, "dense") \
        == pytest.approx(extra, abs=2)
    # whole-layer recompute keeps the layer's input alone: fp32
    full_a, full_b = (gpt(fp, tp, recompute="full").model.arch for fp in (False, True))
    assert layer_activation_bytes(full_b, "dense") == 4 * s * mb * h // tp
    assert layer_activation_bytes(full_a, "dense") == 2 * s * mb * h // tp


def test_the_stream_moves_at_4_bytes() -> None:
    a, b = gpt(False).model.arch, gpt(True).model.arch
    th = a.seq_length * a.micro_batch_size * a.hidden_size
    plain = {op.name: op.nbytes for op in layer_ops(a, "dense")}
    wide = {op.name: op.nbytes for op in layer_ops(b, "dense")}
    # a norm reads the stream and writes its output in bf16
    assert plain["norm1"] == th * (2 + 2) and wide["norm1"] == th * (4 + 2)
    # dropout(x) + residual: reads x in bf16 and the fp32 stream, writes the stream, a mask
    assert plain["residual1"] == th * (2 + 2 + 2 + 1)
    assert wide["residual1"] == th * (2 + 4 + 4 + 1)
    c = gpt(True)
    acc = accelerator(c.hardware)
    on, off = transformer_costs(b, acc), transformer_costs(a, acc)
    assert on.layers[0].forward_ms > off.layers[0].forward_ms
    # the pipeline sends the fp32 stream
    assert on.layers[0].output_bytes == 4 * th and off.layers[0].output_bytes == 2 * th
    assert on.embedding.output_bytes == 4 * th


MODEL = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16",
         "--seq-length", "2048", "--max-position-embeddings", "2048", "--vocab-size",
         "32000", "--pp", "2", "--hardware", "h100-80gb"]


def test_megatron_flag_read_and_written(capsys: pytest.CaptureFixture) -> None:
    assert main(["simulate", *MODEL, "--bf16", "--fp32-residual-connection", "--json"]) == 0
    capsys.readouterr()
    assert "--fp32-residual-connection" in megatron_model_args(gpt(True).model.arch)
    assert "--fp32-residual-connection" not in megatron_model_args(gpt(False).model.arch)
    # Megatron asserts fp16 or bf16 (its model from flags trains in fp32 otherwise)
    assert main(["simulate", *MODEL, "--fp32-residual-connection"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.fp32_residual" in err[0] and "bf16" in err[0]


def test_the_executor_refuses_it(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("torch")

    def no_launch(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch, "run_torchrun", no_launch)  # ppsim run forks torchrun
    rc = main(["run", "--preset", "tiny-gpt", "--bf16", "--fp32-residual-connection",
               "--trace-dir", str(tmp_path / "t")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "model.fp32_residual" in err[0], err
