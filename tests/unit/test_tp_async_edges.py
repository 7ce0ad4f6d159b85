"""Megatron's column-parallel backward beyond the sequence-parallel layers': the output
layer (a ColumnParallelLinear) gathers its input again beside its input-gradient GEMM
and reduce-scatters the input's gradient beside its weight-gradient GEMM; without
sequence parallelism every column-parallel linear all-reduces its input's gradient
beside its weight-gradient GEMM (`allreduce_dgrad`), the layers' and the head's; an MTP
depth's own pass through the embedding and the head waits as theirs do. Closed forms on
random sizes: what a GEMM leaves of each, plus NCCL's 16 of the H100's 132 SMs of what
it hides."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import tp_job
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.layerops import head_ops, layer_ops
from ppsim.costs.ops import op_times
from ppsim.costs.transformer import transformer_costs
from ppsim.job.collectives import all_gather_ms, all_reduce_ms, behind_compute_ms, reduce_scatter_ms
from ppsim.job.comm_rows import piece_rows
from ppsim.job.layers import compute_costs, edge_tp_collectives, job_costs, layer_collectives
from ppsim.job.mtp_tp import eh_proj_collectives
from ppsim.job.traffic import recomputed

NCCL_SHARE = 16 / 132


def job_at(tp: int, preset: str = "llama3-8b", **model):
    return tp_job(tp, preset, **model)[1]


def resized(job, hidden: int, seq: int, mbs: int, **over):
    return replace(job, arch=replace(job.arch, hidden_size=hidden, seq_length=seq,
                                     micro_batch_size=mbs, **over))


def gemm_ms(ops, r, name: str) -> tuple[float, float]:
    """(input-gradient, weight-gradient) ms of the op `name`."""
    (op,) = (op for op in ops if op.name == name)
    _, dgrad, wgrad, _, _ = op_times(r, op)
    return dgrad, wgrad


def head_waits(job) -> tuple[float, float]:
    """(forward, backward) the head waits for beyond its compute."""
    got, alone = job_costs(job, job.accelerator), compute_costs(job, job.accelerator)
    return (got.head.forward_ms - alone.head.forward_ms,
            got.head.backward_ms - alone.head.backward_ms)


SIZES = dict(hidden=st.integers(1, 64).map(lambda n: 128 * n),
             seq=st.sampled_from([512, 1024, 4096, 8192, 32768]),
             mbs=st.integers(1, 4), tp=st.sampled_from([2, 4, 8]))


@settings(max_examples=30, deadline=None)
@given(**SIZES, sp=st.booleans())
def test_the_heads_backward_runs_beside_its_gemms(hidden: int, seq: int, mbs: int, tp: int,
                                                   sp: bool) -> None:
    """Sequence parallel: the forward's gather waits; the backward's re-gather hides
    behind the logits' input-gradient GEMM and the scatter behind their weight-gradient
    GEMM. Without it: the input gradient's all-reduce behind the weight-gradient GEMM."""
    job = resized(job_at(tp, sequence_parallel=sp), hidden, seq, mbs)
    link, a = job.link("tp"), job.arch
    plain = seq * mbs * hidden * 2  # bf16
    dgrad, wgrad = gemm_ms(head_ops(a), job.accelerator.roofline(), "output")
    f, b = head_waits(job)
    if sp:
        ag, rs = all_gather_ms(plain, link), reduce_scatter_ms(plain, link)
        assert f == pytest.approx(ag)
        assert b == pytest.approx(behind_compute_ms(ag, dgrad, NCCL_SHARE)
                                  + behind_compute_ms(rs, wgrad, NCCL_SHARE))
    else:
        assert f == 0.0
        assert b == pytest.approx(behind_compute_ms(all_reduce_ms(plain, link), wgrad,
                                                    NCCL_SHARE))


def test_torchtitans_head_waits_for_its_collectives() -> None:
    """torchtitan's ColwiseParallel output runs its backward's scatter on the compute
    stream (and gathers nothing again)."""
    job = job_at(4, fsdp=True, fsdp_framework="torchtitan", dp=2)
    plain = job.arch.seq_length * job.arch.micro_batch_size * job.arch.hidden_size * 2
    (b,) = edge_tp_collectives(job, job.arch, job.accelerator, head=True).backward
    assert b.exposed_ms == b.total_ms == pytest.approx(reduce_scatter_ms(plain, job.link("tp")))


@settings(max_examples=30, deadline=None)
@given(**SIZES, recompute=st.sampled_from(["none", "selective", "full"]))
def test_without_sequence_parallelism_the_input_gradients_all_reduce_beside_wgrad(
        hidden: int, seq: int, mbs: int, tp: int, recompute: str) -> None:
    """Each sublayer's column-parallel linears (the QKV projection, fc1) all-reduce their
    input's gradient async beside their weight-gradient GEMM; a full recompute's repeats
    of the forward's all-reduces wait."""
    job = resized(job_at(tp, sequence_parallel=False), hidden, seq, mbs, recompute=recompute)
    a, r = job.arch, job.accelerator.roofline()
    ar = all_reduce_ms(seq * mbs * hidden * 2, job.link("tp"))
    ops = layer_ops(a, "dense")
    beside = sum(behind_compute_ms(ar, gemm_ms(ops, r, name)[1], NCCL_SHARE)
                 for name in ("qkv", "mlp.fc1"))
    cost = transformer_costs(a, job.accelerator).layers[0]
    comm = layer_collectives(job, a, job.accelerator, "dense", cost)
    fwd, bwd = (next(c for c in side if c.group == "tp") for side in (comm.forward, comm.backward))
    again = 2 * ar if recompute == "full" else 0.0
    assert fwd.exposed_ms == pytest.approx(2 * ar)
    assert bwd.total_ms == pytest.approx(2 * ar + again)
    assert bwd.exposed_ms == pytest.approx(beside + again)


@pytest.mark.parametrize("sp", [True, False])
def test_an_mtp_depth_passes_through_the_embedding_and_the_head(sp: bool) -> None:
    """An MTP module (DeepSeek-V3's) embeds the shifted tokens (scattered under sequence
    parallelism, gathered back in the backward) and runs the output layer again (its
    input gathered, and again in the backward beside the logits' GEMMs, the gradient
    scattered), and projects with eh_proj (mtp_tp): what it waits for beyond its decoder
    layer is the embedding's, the head's and the projection's, and `ppsim costs`
    itemizes what it prices (the projection's output gathered, and its gradient under
    sequence parallelism, at the hidden width)."""
    job = job_at(2, mtp_layers=1, recompute="none", sequence_parallel=sp)
    got, alone = job_costs(job, job.accelerator), compute_costs(job, job.accelerator)
    mtp = got.kinds.index("mtp")
    kind = got.kinds[mtp - 1]

    def extra(g, al) -> tuple[float, float]:
        return g.forward_ms - al.forward_ms, g.backward_ms - al.backward_ms

    own, layer = extra(got.layers[mtp], alone.layers[mtp]), \
        extra(got.layers[mtp - 1], alone.layers[mtp - 1])
    head, emb = extra(got.head, alone.head), extra(got.embedding, alone.embedding)
    proj = eh_proj_collectives(job, job.arch, job.accelerator, False)
    proj_waits = [sum(c.exposed_ms for c in d) for d in (proj.forward, proj.backward)]
    for side in (0, 1):
        assert own[side] == pytest.approx(layer[side] + head[side] + emb[side]
                                          + proj_waits[side])
    a = job.arch
    rows = [r for r in piece_rows(job, a, "mtp", "mtp", recomputed(a))
            if r.collective.startswith("tp ")]
    layer_rows = [r for r in piece_rows(job, a, kind, kind, recomputed(a))
                  if r.collective.startswith("tp ")]
    plain = a.seq_length * a.micro_batch_size * a.hidden_size * 2
    mine = {(r.collective, r.exposure): r.count for r in rows if r.nbytes == plain}
    for r in layer_rows:
        if r.nbytes == plain:
            mine[r.collective, r.exposure] -= r.count
    want = {("tp all-gather", "exposed"): 4, ("tp all-gather", "overlap"): 1,
            ("tp reduce-scatter", "exposed"): 1, ("tp reduce-scatter", "overlap"): 1} \
        if sp else {("tp all-reduce", "exposed"): 1, ("tp all-reduce", "overlap"): 1,
                    ("tp all-gather", "exposed"): 1}
    assert {k: v for k, v in mine.items() if v} == want
