"""Megatron's MoE shared experts at tp > 1 (SharedExpertMLP: TE's column- and
row-parallel fc1 and fc2) and an MTP depth's eh_proj, against closed forms on random
sizes. Without --moe-shared-expert-overlap the shared experts gather the block's input
and scatter their output as a dense MLP does (the backward gathers the output's gradient
and the input again, the latter beside fc1's input-gradient GEMM, and scatters the
input's gradient beside its weight-gradient GEMM; without sequence parallelism one
all-reduce each way, the backward's beside the weight-gradient GEMM); under it they
gather and scatter (or all-reduce) each way on a side stream beside the dispatcher,
nothing again, nothing beside a GEMM or on userbuffers. eh_proj gathers its 2h-wide
input and its output's columns, the backward gathers the output's gradient, the input
again beside the input-gradient GEMM and scatters the input's gradient beside the
weight-gradient GEMM; without sequence parallelism the output's gather, and the input
gradient's all-reduce beside the weight-gradient GEMM."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import tp_job
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.layerops import layer_ops, mtp_ops
from ppsim.costs.model import LayerCost
from ppsim.costs.ops import op_times
from ppsim.job.collectives import (
    all_gather_ms,
    all_reduce_ms,
    behind_compute_ms,
    reduce_scatter_ms,
)
from ppsim.job.ep_comm import ep_all_to_all_ms, shared_experts_ms
from ppsim.job.layers import compute_costs, job_costs, layer_collectives
from ppsim.job.traffic import Recomputed, tp_layer_ms
from ppsim.job.userbuffers import overlapped_ms

NCCL_SHARE = 16 / 132
COST = LayerCost(forward_ms=3.0, backward_ms=6.0, weight_grad_ms=0.0, static_bytes=0,
                 activation_bytes=0)


def _job(tp: int, preset: str = "deepseek-v3", **model):
    # experts whole on each tensor rank: no dispatcher gathers over etp in the tp lane
    layers = {"layers": "dense, moe*3", "etp": 1} if preset == "deepseek-v3" else {}
    return tp_job(tp, preset, **{**layers, "recompute": "none", **model})[1]


def _resized(job, seq: int, mbs: int, width: int, **flags):
    return replace(job, arch=replace(job.arch, seq_length=seq, micro_batch_size=mbs,
                                     shared_expert_ffn_hidden_size=width), **flags)


def _tp(job, again: Recomputed | None = None) -> tuple[list, list]:
    """The MoE layer's tp collectives, (forward, backward)."""
    comm = layer_collectives(job, job.arch, job.accelerator, "moe", COST,
                             again or Recomputed())
    return ([c for c in comm.forward if c.group == "tp"],
            [c for c in comm.backward if c.group == "tp"])


SIZES = dict(seq=st.sampled_from([512, 1024, 4096, 8192]), mbs=st.integers(1, 4),
             width=st.integers(1, 32).map(lambda n: 256 * n), tp=st.sampled_from([2, 4, 8]))


@settings(max_examples=25, deadline=None)
@given(**SIZES, sp=st.booleans(), again=st.booleans())
def test_the_shared_experts_are_a_sublayer_of_their_own(seq: int, mbs: int, width: int,
                                                        tp: int, sp: bool,
                                                        again: bool) -> None:
    """What the shared experts add to a MoE layer's tp collectives (against the layer
    without them), `again` where their recompute (shared_experts) repeats the forward's."""
    job = _resized(_job(tp), seq, mbs, width)
    job = replace(job, arch=replace(job.arch, sequence_parallel=sp))
    bare = replace(job, arch=replace(job.arch, shared_expert_ffn_hidden_size=0,
                                     shared_experts=0))
    redo = Recomputed(shared=again)
    (f,), (b,) = _tp(job, redo)
    (f0,), (b0,) = _tp(bare, redo)
    link, plain = job.link("tp"), seq * mbs * job.arch.hidden_size * 2
    ops = {op.name: op for op in layer_ops(job.arch, "moe")}
    _, dgrad, wgrad, _, _ = op_times(job.accelerator.roofline(), ops["shared.fc1"])
    if sp:
        ag, rs = all_gather_ms(plain, link), reduce_scatter_ms(plain, link)
        fwd, redone = ag + rs, (ag + rs) * again
        bwd_total, bwd_waits = 2 * ag + rs + redone, ag + redone \
            + behind_compute_ms(ag, dgrad, NCCL_SHARE) + behind_compute_ms(rs, wgrad, NCCL_SHARE)
    else:
        ar = all_reduce_ms(plain, link)
        fwd = ar
        bwd_total, bwd_waits = ar * (1 + again), ar * again + behind_compute_ms(ar, wgrad,
                                                                                NCCL_SHARE)
    assert f.total_ms - f0.total_ms == pytest.approx(fwd)
    assert f.exposed_ms - f0.exposed_ms == pytest.approx(fwd)
    assert b.total_ms - b0.total_ms == pytest.approx(bwd_total)
    assert b.exposed_ms - b0.exposed_ms == pytest.approx(bwd_waits)


@settings(max_examples=10, deadline=None)
@given(**SIZES)
def test_userbuffers_hide_the_shared_experts_as_a_dense_mlps(seq: int, mbs: int, width: int,
                                                             tp: int) -> None:
    """--tp-comm-overlap: two sublayers of TE userbuffers' collectives, attention's and
    the shared experts'."""
    job = _resized(_job(tp), seq, mbs, width, tp_comm_overlap=True)
    (f,), (b,) = _tp(job)
    for got, t, compute in zip((f, b), tp_layer_ms(job, job.arch, 2),
                               (COST.forward_ms, COST.backward_ms), strict=True):
        assert got.total_ms == pytest.approx(t.total_ms)
        assert got.exposed_ms == pytest.approx(overlapped_ms(t, compute, job.sm_count))


@settings(max_examples=20, deadline=None)
@given(**SIZES, ub=st.booleans(), ep=st.sampled_from([1, 8]), again=st.booleans())
def test_beside_the_dispatcher_the_side_stream_waits_past_the_all_to_alls(
        seq: int, mbs: int, width: int, tp: int, ub: bool, ep: int, again: bool) -> None:
    """--moe-shared-expert-overlap: a gather and a scatter each way, again where the MoE
    block is recomputed, waited for past what the all-to-alls take beyond the shared
    experts' compute; the layer's own sublayers are its attention's alone, on userbuffers
    or not (Megatron refuses a MoE at tp > 1 without sequence parallelism)."""
    job = _resized(_job(tp, ep=ep), seq, mbs, width, moe_shared_expert_overlap=True,
                   tp_comm_overlap=ub)
    link, plain = job.link("tp"), seq * mbs * job.arch.hidden_size * 2
    side = all_gather_ms(plain, link) + reduce_scatter_ms(plain, link)
    a2a = ep_all_to_all_ms(job, job.arch)
    over = shared_experts_ms(job.arch, job.accelerator)
    (own_f, side_f), (own_b, side_b) = _tp(job, Recomputed(dispatch=again))
    assert side_f.total_ms == pytest.approx(side)
    assert side_f.exposed_ms == pytest.approx(max(0.0, side - max(0.0, a2a - over[0])))
    assert side_b.total_ms == pytest.approx(side * (1 + again))
    assert side_b.exposed_ms == pytest.approx(
        max(0.0, side - max(0.0, a2a - over[1])) + again * side_f.exposed_ms)
    attention, _ = tp_layer_ms(job, job.arch, 1)
    assert own_f.total_ms == pytest.approx(attention.total_ms)


SEQS = dict(hidden=st.integers(1, 64).map(lambda n: 128 * n),
            seq=st.sampled_from([512, 1024, 4096, 8192, 32768]),
            mbs=st.integers(1, 4), tp=st.sampled_from([2, 4, 8]))


@settings(max_examples=25, deadline=None)
@given(**SEQS, sp=st.booleans(), full=st.booleans(), ub=st.booleans())
def test_an_mtp_depths_projection_gathers_and_scatters(hidden: int, seq: int, mbs: int,
                                                       tp: int, sp: bool, full: bool,
                                                       ub: bool) -> None:
    """What an MTP depth waits for beyond its decoder layer, the embedding's and the
    head's: eh_proj's collectives, the forward's again under a full recompute;
    --tp-comm-overlap leaves them so (no userbuffer of TE's)."""
    job = _job(tp, "llama3-8b", mtp_layers=1, sequence_parallel=sp,
               recompute="full" if full else "none")
    job = replace(job, arch=replace(job.arch, hidden_size=hidden, seq_length=seq,
                                    micro_batch_size=mbs), tp_comm_overlap=ub and sp)
    got, alone = job_costs(job, job.accelerator), compute_costs(job, job.accelerator)
    mtp = got.kinds.index("mtp")

    def extra(g, al) -> tuple[float, float]:
        return g.forward_ms - al.forward_ms, g.backward_ms - al.backward_ms

    own, layer = extra(got.layers[mtp], alone.layers[mtp]), \
        extra(got.layers[mtp - 1], alone.layers[mtp - 1])
    head, emb = extra(got.head, alone.head), extra(got.embedding, alone.embedding)
    link, plain = job.link("tp"), seq * mbs * hidden * 2
    (op,) = (op for op in mtp_ops(job.arch) if op.name == "mtp.proj")
    _, dgrad, wgrad, _, _ = op_times(job.accelerator.roofline(), op)
    out = all_gather_ms(plain, link)
    if sp:
        inputs = all_gather_ms(2 * plain, link)
        fwd = inputs + out
        bwd = out + fwd * full + behind_compute_ms(inputs, dgrad, NCCL_SHARE) \
            + behind_compute_ms(reduce_scatter_ms(2 * plain, link), wgrad, NCCL_SHARE)
    else:
        fwd = out
        bwd = out * full + behind_compute_ms(all_reduce_ms(2 * plain, link), wgrad, NCCL_SHARE)
    assert own[0] - layer[0] - head[0] - emb[0] == pytest.approx(fwd)
    assert own[1] - layer[1] - head[1] - emb[1] == pytest.approx(bwd)
