"""The sequence-parallel backward's second gather of each column-parallel linear's input:
Megatron's LinearWithGradAccumulationAndAsyncCommunication (and Transformer Engine's
LayerNormLinear and Linear) keep the rank's own tokens and gather them again for the
weight gradient, so a sublayer's backward moves two all-gathers and one reduce-scatter
(the forward one of each); torchtitan's ColwiseParallel keeps the gathered input and
gathers once."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.collectives import all_gather_ms, reduce_scatter_ms
from ppsim.job.comm_rows import edge_rows
from ppsim.job.model import build_job
from ppsim.job.traffic import edge_tp_ms, tp_layer_ms
from ppsim.pipeline.problem import model_costs


def job_at(tp: int, **model):
    c = config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, "tp": tp,
                                    **model},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    job = build_job(c)
    assert job is not None
    return c, job


SIZES = dict(hidden=st.integers(1, 64).map(lambda n: 128 * n),
             seq=st.sampled_from([512, 1024, 4096, 8192, 32768]),
             mbs=st.integers(1, 4), tp=st.sampled_from([2, 4, 8]),
             sublayers=st.sampled_from([1, 2]), fp8=st.booleans(),
             again=st.sampled_from([0.0, 0.5, 1.0]))


@settings(max_examples=40, deadline=None)
@given(**SIZES)
def test_a_megatron_backward_gathers_each_input_again(hidden: int, seq: int, mbs: int,
                                                     tp: int, sublayers: int, fp8: bool,
                                                     again: float) -> None:
    _, job = job_at(tp)
    a = replace(job.arch, hidden_size=hidden, seq_length=seq, micro_batch_size=mbs,
                fp8="e4m3" if fp8 else "")
    link = job.link("tp")
    plain = seq * mbs * hidden * 2  # bf16
    inputs = seq * mbs * hidden * (1 if fp8 else 2)  # what TE gathers, quantized or not
    ag_in, ag, rs = (all_gather_ms(inputs, link), all_gather_ms(plain, link),
                     reduce_scatter_ms(plain, link))
    f, b = tp_layer_ms(job, a, sublayers, again)
    assert f.total_ms == pytest.approx(sublayers * (ag_in + rs))
    # the gradient's gather, the input's again, the gradient's scatter; and the
    # recompute's forward beside them, its gather feeding its own GEMM alone
    assert b.gathers_ms == pytest.approx(sublayers * (ag + ag_in * (1 + again)))
    assert b.regathers_ms == pytest.approx(sublayers * ag_in)
    assert b.total_ms == pytest.approx(sublayers * (ag + ag_in + rs + again * (ag_in + rs)))


@settings(max_examples=20, deadline=None)
@given(**SIZES)
def test_torchtitan_keeps_the_gathered_input(hidden: int, seq: int, mbs: int, tp: int,
                                             sublayers: int, fp8: bool,
                                             again: float) -> None:
    _, job = job_at(tp)
    a = replace(job.arch, hidden_size=hidden, seq_length=seq, micro_batch_size=mbs,
                fp8="e4m3" if fp8 else "", fsdp=True, fsdp_framework="torchtitan")
    link = job.link("tp")
    inputs = seq * mbs * hidden * (1 if fp8 else 2)
    ag_in, ag = all_gather_ms(inputs, link), all_gather_ms(seq * mbs * hidden * 2, link)
    _, b = tp_layer_ms(job, a, sublayers, again)
    assert b.gathers_ms == pytest.approx(sublayers * (ag + ag_in * again))
    assert b.regathers_ms == 0.0
    # Megatron's own FSDPs keep Megatron's linears
    _, mb = tp_layer_ms(job, replace(a, fsdp_framework="megatron-fsdp"), sublayers, again)
    assert mb.regathers_ms == pytest.approx(sublayers * ag_in)


@pytest.mark.parametrize("framework, extra", [("megatron", 1), ("torchtitan", 0)])
def test_the_head_gathers_its_input_again_under_megatron(framework: str, extra: int) -> None:
    """Megatron's output layer is a ColumnParallelLinear: its backward gathers its input
    again beside the gradient's scatter; torchtitan's ColwiseParallel output does not."""
    _, job = job_at(4)
    a = replace(job.arch, fsdp=framework == "torchtitan")
    s = a.seq_length * a.micro_batch_size * a.hidden_size * 2
    link = job.link("tp")
    f, b = edge_tp_ms(job, a, head=True)
    assert f == pytest.approx(all_gather_ms(s, link))
    assert b == pytest.approx(reduce_scatter_ms(s, link) + extra * all_gather_ms(s, link))
    # `ppsim costs` itemizes it as priced
    rows = edge_rows(job, a, head=True)
    assert sum(r.ms * r.count for r in rows) == pytest.approx(f + b)
    gathers = next(r for r in rows if r.collective == "tp all-gather")
    assert gathers.count == 1 + extra


def test_without_tensor_parallelism_nothing_changes() -> None:
    """At tp 1 a layer's and the head's costs are the model's own."""
    c, job = job_at(1)
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    got = model_costs(c)
    assert got.layers == alone.layers
    assert got.head == alone.head
    for sublayers in (1, 2):
        f, b = tp_layer_ms(job, job.arch, sublayers, 1.0)
        assert f.total_ms == b.total_ms == b.regathers_ms == 0.0
    assert edge_tp_ms(job, job.arch, head=True) == (0.0, 0.0)
