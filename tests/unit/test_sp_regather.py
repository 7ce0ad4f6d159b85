"""The sequence-parallel backward's second gather of each column-parallel linear's input:
Megatron's LinearWithGradAccumulationAndAsyncCommunication (and Transformer Engine's
LayerNormLinear and Linear) keep the rank's own tokens and gather them again for the
weight gradient, so a sublayer's backward moves two all-gathers and one reduce-scatter
(the forward one of each); torchtitan's ColwiseParallel keeps the gathered input and
gathers once."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import tp_job
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.kinds import GemmWindow, gathered_gemm_windows
from ppsim.costs.layerops import layer_ops
from ppsim.costs.ops import op_times
from ppsim.costs.stack import layer_kinds
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.collectives import all_gather_ms, behind_compute_ms, reduce_scatter_ms
from ppsim.job.comm_rows import edge_rows
from ppsim.job.layers import layer_collectives
from ppsim.job.traffic import (
    dispatcher_tp_ms,
    edge_tp_traffic,
    hidden_bytes,
    tp_layer_ms,
    tp_sublayers,
)
from ppsim.job.userbuffers import overlapped_ms
from ppsim.pipeline.problem import model_costs

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
    _, job = tp_job(tp)
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
    _, job = tp_job(tp)
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
    _, job = tp_job(4)
    a = replace(job.arch, fsdp=framework == "torchtitan")
    s = a.seq_length * a.micro_batch_size * a.hidden_size * 2
    link = job.link("tp")
    f, b = (t.total_ms for t in edge_tp_traffic(job, a, head=True))
    assert f == pytest.approx(all_gather_ms(s, link))
    assert b == pytest.approx(reduce_scatter_ms(s, link) + extra * all_gather_ms(s, link))
    # `ppsim costs` itemizes it as priced
    rows = edge_rows(job, a, head=True)
    assert sum(r.ms * r.count for r in rows) == pytest.approx(f + b)
    gathers = [r for r in rows if r.collective == "tp all-gather"]
    assert sum(r.count for r in gathers) == 1 + extra
    # the forward's waits; Megatron's backward runs beside the logits GEMM (tp_async)
    assert [r.exposure for r in gathers] == ["exposed", "overlap"][:1 + extra]


def test_without_tensor_parallelism_nothing_changes() -> None:
    """At tp 1 a layer's and the head's costs are the model's own."""
    c, job = tp_job(1)
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    got = model_costs(c)
    assert got.layers == alone.layers
    assert got.head == alone.head
    for sublayers in (1, 2):
        f, b = tp_layer_ms(job, job.arch, sublayers, 1.0)
        assert f.total_ms == b.total_ms == b.regathers_ms == 0.0
    assert [t.total_ms for t in edge_tp_traffic(job, job.arch, head=True)] == [0.0, 0.0]


# ------------------------------------------------------------ beside the backward's GEMMs

NCCL_SHARE = 16 / 132
"""An NCCL collective's 16 channels, an SM each, of the H100's 132 SMs."""


def tp_backward(job, a, kind: str = "dense", again=None):
    """The layer's tensor-parallel collective in its backward (its compute is unread
    without --tp-comm-overlap and FSDP)."""
    cost = transformer_costs(a, job.accelerator).layers[0]
    comm = layer_collectives(job, a, job.accelerator, kind, cost, again)
    return next(c for c in comm.backward if c.group == "tp")


def gemms(a, r, *names: str) -> tuple[float, float]:
    """The input- and weight-gradient ms of a dense layer's ops named `names`."""
    ops = [op for op in layer_ops(a, "dense") if op.name in names]
    assert len(ops) == len(names)
    return sum(op_times(r, op)[1] for op in ops), sum(op_times(r, op)[2] for op in ops)


@settings(max_examples=40, deadline=None)
@given(hidden=SIZES["hidden"], seq=SIZES["seq"], mbs=SIZES["mbs"], tp=SIZES["tp"],
       fp8=SIZES["fp8"], recompute=st.sampled_from(["none", "selective", "full"]))
def test_megatron_hides_the_regather_behind_dgrad_and_the_scatter_behind_wgrad(
        hidden: int, seq: int, mbs: int, tp: int, fp8: bool, recompute: str) -> None:
    """Megatron's LinearWithGradAccumulationAndAsyncCommunication.backward: the input's
    gather again launched async before the input-gradient GEMM, the input gradient's
    reduce-scatter before the weight-gradient GEMM; each sublayer's (the QKV
    projection's, fc1's) waits for what its GEMM leaves and slows it by NCCL's SM share
    of what it hides. The output gradient's gathers and a recompute's repeats wait."""
    _, job = tp_job(tp)
    a = replace(job.arch, hidden_size=hidden, seq_length=seq, micro_batch_size=mbs,
                fp8="e4m3" if fp8 else "", recompute=recompute)
    link, r = job.link("tp"), job.accelerator.roofline()
    plain = seq * mbs * hidden * 2
    ag_in = all_gather_ms(seq * mbs * hidden * (1 if fp8 else 2), link)
    ag, rs = all_gather_ms(plain, link), reduce_scatter_ms(plain, link)
    full = recompute == "full"  # the forward's gathers and scatters again
    sync = 2 * ag + (2 * (ag_in + rs) if full else 0.0)
    beside = sum(behind_compute_ms(ag_in, dgrad, NCCL_SHARE)
                 + behind_compute_ms(rs, wgrad, NCCL_SHARE)
                 for dgrad, wgrad in (gemms(a, r, "qkv"), gemms(a, r, "mlp.fc1")))
    got = tp_backward(job, a)
    assert got.total_ms == pytest.approx(sync + 2 * (ag_in + rs))
    assert got.exposed_ms == pytest.approx(sync + beside)


def test_gemms_that_outlast_them_leave_only_the_sm_share() -> None:
    """llama3-8b at tp 4 on H100s: the QKV projection's and fc1's backward GEMMs outlast
    the gather and the scatter beside them."""
    _, job = tp_job(4)
    a, r = replace(job.arch, recompute="none"), job.accelerator.roofline()
    link, s = job.link("tp"), hidden_bytes(job.arch)
    ag, rs = all_gather_ms(s, link), reduce_scatter_ms(s, link)
    assert min(*gemms(a, r, "qkv"), *gemms(a, r, "mlp.fc1")) > max(ag, rs)
    got = tp_backward(job, a)
    assert got.exposed_ms == pytest.approx(2 * ag + NCCL_SHARE * 2 * (ag + rs))
    # a MoE layer's attention alone gathers, beside its QKV projection
    moe, win = replace(a, num_experts=8, top_k=2, moe_ffn_hidden_size=2048), gemms(a, r, "qkv")
    assert gathered_gemm_windows(moe, r, "moe") == (
        GemmWindow(input_grad_ms=win[0], weight_grad_ms=win[1]),)
    dispatcher = dispatcher_tp_ms(job, moe)  # its gathers over etp, on the compute stream
    assert tp_backward(job, moe, "moe").exposed_ms == pytest.approx(
        ag + NCCL_SHARE * (ag + rs) + dispatcher)


@pytest.mark.parametrize("framework, flags", [
    ("torchtitan", {}), ("megatron", {"tp_comm_overlap": True})])
def test_torchtitan_and_userbuffers_price_as_they_did(framework: str, flags: dict) -> None:
    """torchtitan's linears wait for every collective; --tp-comm-overlap's userbuffers
    hide them their own way (ppsim.job.userbuffers)."""
    _, job = tp_job(4)
    job = replace(job, **flags)
    a = replace(job.arch, recompute="none", fsdp=framework == "torchtitan")
    got = tp_backward(job, a)
    cost = transformer_costs(a, job.accelerator).layers[0]
    _, t = tp_layer_ms(job, a, 2)
    want = overlapped_ms(t, cost.backward_ms, job.sm_count) if flags else t.total_ms
    assert got.exposed_ms == pytest.approx(want)


def test_each_gathered_sublayer_has_a_window() -> None:
    """As many windows as sublayers gather (tp_sublayers): attention, MLP, Mamba,
    GatedDeltaNet one each, MLA through its up-projections, a MoE block its shared
    experts' where it has some (none beside the dispatcher)."""
    c = config_from_dict({"model": {"preset": "tiny-hybrid", "tp": 2},
                          "hardware": {"preset": "h100-80gb"}})
    r, a = accelerator(c.hardware).roofline(), c.model.arch
    kinds = set(layer_kinds(a))
    assert kinds >= {"mamba", "mlp", "attention", "gdn", "moe-mlp"}
    for kind in kinds:
        assert len(gathered_gemm_windows(a, r, kind)) == tp_sublayers(a, kind), kind
    mla = config_from_dict({"model": {"preset": "deepseek-v3", "num_layers": 4, "tp": 2},
                            "hardware": {"preset": "h100-80gb"}}).model.arch
    ops = {op.name: op for op in layer_ops(mla, "dense")}
    moe = {op.name: op for op in layer_ops(mla, "moe")}
    w, shared = gathered_gemm_windows(mla, r, "moe")
    assert shared.weight_grad_ms == pytest.approx(op_times(r, moe["shared.fc1"])[2])
    assert gathered_gemm_windows(mla, r, "moe", shared=False) == (w,)
    assert tp_sublayers(mla, "moe") == 2 and tp_sublayers(mla, "moe", True) == 1
    assert w.input_grad_ms == pytest.approx(sum(op_times(r, ops[n])[1]
                                                for n in ("q_up", "kv_up")))
