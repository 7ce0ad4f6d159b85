"""`ppsim costs`' collectives table: each collective the simulation prices, with its
message, group, link, time and count, against closed forms stated here from the preset's
datasheet figures (H100: NVLink 450 GB/s each way, 1 us a step; 8 GPUs a node; the
point-to-point link 50 GB/s, 10 us), and the counts against the layer costs' own sums."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.costfile import read_cost_file
from ppsim.errors import UserError
from ppsim.job.comm_rows import CommRow
from ppsim.job.layers import (
    compute_costs,
    edge_collectives,
    fsdp_collectives,
    layer_collectives,
    per_rank_arch,
)
from ppsim.job.traffic import recomputed
from ppsim.pipeline.comm_table import problem_rows
from ppsim.pipeline.problem import build_problem
from ppsim.sim.summary import rank_tails

NV, NV_STEP = 450e6, 1e-3  # NVLink bytes per ms, ms a ring step
P2P, P2P_MS = 50e6, 0.01  # the [hardware] point-to-point link
S = 8192 * 4096 * 2  # llama3-8b's hidden states of one microbatch, bf16


def cfg(model: dict, pipe: dict | None = None, preset: str = "llama3-8b"):
    return config_from_dict({"model": {"preset": preset, "num_layers": 4, **model},
                             "pipeline": {"pp": 1, "microbatches": 4, **(pipe or {})},
                             "hardware": {"preset": "h100-80gb"}})


def rows_of(model: dict, pipe: dict | None = None, preset: str = "llama3-8b"
            ) -> list[CommRow]:
    return problem_rows(build_problem(cfg(model, pipe, preset)))


def row(rows: list[CommRow], collective: str, piece: str, nbytes: float = 0) -> CommRow:
    found = [r for r in rows if r.collective == collective and r.piece == piece
             and (not nbytes or r.nbytes == pytest.approx(nbytes))]
    assert len(found) == 1, (collective, piece, rows)
    return found[0]


def ring(n: int, nbytes: float) -> float:
    """An all-gather or reduce-scatter of `nbytes` in all over n GPUs of a node."""
    return (n - 1) * NV_STEP + (n - 1) / n * nbytes / NV


def test_sequence_parallel_gathers_and_scatters() -> None:
    rows = rows_of({"tp": 4, "recompute": "none"})
    # each sublayer's input gathered forward, its output's gradient gathered backward,
    # scattered once each way; the backward's gather of the input again (the weight
    # gradient's) and its scatter of the input's gradient run beside its GEMMs
    layer = [r for r in rows if r.piece == "layer"]
    assert sorted((r.collective, r.exposure, r.count) for r in layer) == [
        ("tp all-gather", "exposed", 4), ("tp all-gather", "overlap", 2),
        ("tp reduce-scatter", "exposed", 2), ("tp reduce-scatter", "overlap", 2)]
    for r in layer:
        assert (r.nbytes, r.ranks, r.link) == (S, 4, "NVLink")
        assert r.ms == pytest.approx(ring(4, S))
    # one each way, the head's input gathered again; the head's backward beside its GEMMs
    edges = sorted((r.piece, r.collective, r.exposure, r.count) for r in rows
                   if r.piece in ("embedding", "head"))
    assert edges == [("embedding", "tp all-gather", "exposed", 1),
                     ("embedding", "tp reduce-scatter", "exposed", 1),
                     ("head", "tp all-gather", "exposed", 1),
                     ("head", "tp all-gather", "overlap", 1),
                     ("head", "tp reduce-scatter", "overlap", 1)]
    # one pipeline stage, one replica: nothing else
    assert {r.collective for r in rows} == {"tp all-gather", "tp reduce-scatter"}
    overlapped = rows_of({"tp": 4, "recompute": "none"}, {"tp_comm_overlap": True})
    assert row(overlapped, "tp all-gather", "layer").exposure == "overlap"
    # torchtitan's linears run none of them beside a GEMM
    titan = rows_of({"tp": 4, "recompute": "none", "fsdp": True,
                     "fsdp_framework": "torchtitan"})
    assert {r.exposure for r in titan if r.piece == "layer"
            and r.collective.startswith("tp ")} == {
        "exposed"}


def test_without_sequence_parallelism_each_sublayer_all_reduces() -> None:
    rows = rows_of({"tp": 4, "recompute": "none", "sequence_parallel": False})
    ring_ar = 2 * 3 * NV_STEP + 2 * 3 / 4 * S / NV
    tree_ar = 2 * 2 * NV_STEP + 2 * 3 / 4 * S / (NV / 2)
    # attention's and the MLP's, forward and backward; the backward's (the input
    # gradients') beside the weight-gradient GEMMs, as the head's
    got = sorted((r.piece, r.exposure, r.count) for r in rows if r.collective == "tp all-reduce")
    assert got == [("embedding", "exposed", 1), ("head", "overlap", 1),
                   ("layer", "exposed", 2), ("layer", "overlap", 2)]
    for r in rows:
        assert r.nbytes == S
        assert r.ms == pytest.approx(min(ring_ar, tree_ar))


def test_context_parallel_ring_sends() -> None:
    rows = rows_of({"cp": 2, "recompute": "none"})
    kv = 4096 * (1024 + 1024) * 2  # a rank's K and V: 8 kv heads x 128, bf16
    fwd, bwd = row(rows, "cp K/V send", "layer", kv), row(rows, "cp K/V send", "layer", 2 * kv)
    assert (fwd.count, bwd.count, fwd.ranks, fwd.exposure) == (1, 1, 2, "overlap")
    assert fwd.ms == pytest.approx(NV_STEP + kv / NV)
    assert bwd.ms == pytest.approx(NV_STEP + 2 * kv / NV)
    # recomputing the attention runs the forward's ring again
    again = rows_of({"cp": 2, "recompute": "selective"})
    assert row(again, "cp K/V send", "layer", kv).count == 2


def test_data_parallel_step() -> None:
    problem = build_problem(cfg({"dp": 2}))
    params = problem.stage_costs[0].params
    r = row(problem_rows(problem), "dp all-reduce", "step")
    assert (r.nbytes, r.ranks, r.link, r.count, r.per) == (params * 4, 2, "NVLink", 1,
                                                          "iteration")
    assert r.ms == pytest.approx(2 * NV_STEP + params * 4 / NV)  # the ring, n = 2
    sharded = problem_rows(build_problem(cfg({"dp": 2, "distributed_optimizer": True})))
    rs, ag = row(sharded, "dp reduce-scatter", "step"), row(sharded, "dp all-gather", "step")
    assert (rs.nbytes, ag.nbytes) == (params * 4, params * 2)  # fp32 grads, bf16 weights
    assert rs.ms == pytest.approx(ring(2, params * 4))
    assert ag.ms == pytest.approx(ring(2, params * 2))


def test_expert_all_to_all() -> None:
    rows = rows_of({"ep": 2, "recompute": "none", "num_layers": 2}, preset="mixtral-8x7b")
    r = row(rows, "ep all-to-all", "moe")
    a = cfg({"ep": 2}, preset="mixtral-8x7b").model.arch
    sent = a.seq_length * a.hidden_size * 2 * a.top_k  # every token's top_k copies, bf16
    assert (r.nbytes, r.ranks, r.count) == (sent, 2, 4)  # dispatch, combine; each way
    assert r.ms == pytest.approx(NV_STEP + sent / 2 / NV)  # half stays on the rank


def test_pipeline_alone_sends_messages_only() -> None:
    rows = rows_of({}, {"pp": 2})
    assert [(r.collective, r.nbytes, r.count, r.link) for r in rows] == [
        ("p2p send", S, 2, "NVLink")]
    assert rows[0].ms == pytest.approx(P2P_MS + S / P2P)
    assert rows_of({}) == []


def test_tied_embedding_all_reduce_once_an_iteration() -> None:
    problem = build_problem(cfg({"tie_embeddings": True}, {"pp": 2}))
    job = problem.hardware.job
    r = row(problem_rows(problem), "tied all-reduce", "step")
    nbytes = job.embedding_params * 4  # its fp32 gradient
    assert (r.nbytes, r.ranks, r.per) == (nbytes, 2, "iteration")
    assert r.ms == pytest.approx(2 * NV_STEP + nbytes / NV)


GROUP = {"tp": "tp", "qkv": "tp", "etp": "tp", "cp": "cp", "ep": "ep"}


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.sampled_from([1, 2]),
       st.sampled_from(["p2p", "all_gather", "a2a"]), st.booleans(),
       st.sampled_from(["none", "selective", "full"]), st.booleans())
def test_rows_add_up_to_what_each_layer_is_priced(tp: int, cp: int, kind: str, sp: bool,
                                                  recompute: str, overlap: bool) -> None:
    """Each group's rows, time times count, are the layer's collectives forward and
    backward as the layer costs price them (GQA 32/8: tp 16 gathers QKV too)."""
    try:
        problem = build_problem(cfg({"tp": tp, "cp": cp, "cp_comm_type": kind,
                                     "recompute": recompute, "sequence_parallel": sp and tp > 1},
                                    {"tp_comm_overlap": overlap and sp and tp > 1}))
    except UserError:  # a shape Megatron refuses (a2a's heads over cp)
        assume(False)
    job = problem.hardware.job
    a = per_rank_arch(job.arch)
    cost = compute_costs(job, job.accelerator).layers[0]
    comm = layer_collectives(job, a, job.accelerator, "dense", cost, recomputed(a))
    want: dict[str, float] = {}
    for col in (*comm.forward, *comm.backward):
        want[col.group] = want.get(col.group, 0.0) + col.total_ms
    got: dict[str, float] = {}
    for r in problem_rows(problem):
        if r.piece == "layer":
            g = GROUP[r.collective.split()[0]]
            got[g] = got.get(g, 0.0) + r.ms * r.count
    assert got == pytest.approx({g: v for g, v in want.items() if v})


def test_json_keeps_the_cost_file_readable(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp", "2", "--pp", "2",
            "--dp", "2", "--num-layers", "4"]
    assert main(["costs", "--json", *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    priced = doc["priced_collectives"]
    assert {p["collective"] for p in priced} >= {"tp all-gather", "p2p send", "dp all-reduce"}
    layer = next(p for p in priced if p["collective"] == "tp all-gather"
                 and p["piece"] == "layer")
    assert layer["ms"] == pytest.approx(ring(2, S)) and layer["nbytes"] == S
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    read = read_cost_file(str(path))
    assert read.in_layer == ()  # not taken for a profile's timed "collectives"
    assert main(["costs", "--costs", str(path), "--json", *args]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["layers"] == doc["layers"]
    # a cost file's layers hold their collectives: only the step's and the pipeline's
    assert {p["collective"] for p in again["priced_collectives"]} == {"p2p send",
                                                                     "dp all-reduce"}


@pytest.mark.parametrize("args", [
    ["--preset", "llama3-8b", "--tp", "4", "--pp", "2", "--dp", "2"],
    ["--preset", "qwen3-30b-a3b", "--tp", "8", "--ep", "4", "--etp", "2", "--pp", "2",
     "--dp", "2", "--gpus", "32"],
    ["--preset", "nemotron-h-8b", "--tp", "2", "--cp", "2", "--dp", "2"],
])
def test_table_fits_80_columns(args: list[str], capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["costs", "--hardware", "h100-80gb", *args]) == 0
    out = capsys.readouterr().out
    table = out[out.index("collectives, as"):]
    assert "…" not in table
    assert all(len(line) <= 80 for line in table.splitlines())
    assert re.search(r"\d+/it", table) and re.search(r"\d+/mb", table)


def test_one_rank_says_none(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costs", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
                 "--num-layers", "2"]) == 0
    assert "collectives: none" in capsys.readouterr().out


def _group_sums(rows: list[CommRow], piece: str) -> dict[str, float]:
    got: dict[str, float] = {}
    for r in rows:
        if r.piece == piece:
            g = GROUP[r.collective.split()[0]]
            got[g] = got.get(g, 0.0) + r.ms * r.count
    return got


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([0, 1]),
       st.sampled_from(["alltoall", "flex"]), st.sampled_from(["none", "full"]))
def test_moe_rows_add_up_to_what_each_layer_is_priced(tp: int, ep: int, etp: int,
                                                      dispatcher: str, recompute: str) -> None:
    """A MoE layer's rows (tensor, expert tensor and expert parallel), and the
    embedding's and head's, are what the layer costs price them."""
    try:
        problem = build_problem(cfg({"tp": tp, "ep": ep, "etp": etp or tp, "num_layers": 2,
                                     "recompute": recompute, "dp": max(1, ep * etp // tp)},
                                    {"moe_token_dispatcher_type": dispatcher},
                                    preset="qwen3-30b-a3b"))
    except UserError:  # a shape Megatron refuses
        assume(False)
    job = problem.hardware.job
    a = per_rank_arch(job.arch)
    costs = compute_costs(job, job.accelerator)
    rows = problem_rows(problem)
    for piece, comm in (
            ("moe", layer_collectives(job, a, job.accelerator, "moe", costs.layers[0])),
            ("embedding", edge_collectives(job, a, job.accelerator, costs.embedding)),
            ("head", edge_collectives(job, a, job.accelerator, costs.head, head=True))):
        want: dict[str, float] = {}
        for col in (*comm.forward, *comm.backward):
            want[col.group] = want.get(col.group, 0.0) + col.total_ms
        assert _group_sums(rows, piece) == pytest.approx({g: v for g, v in want.items() if v})


def _fsdp_problem(pp: int, extra: dict | None = None):
    return build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, "dp": 4, "fsdp": True,
                  **(extra or {})},
        "pipeline": {"pp": pp, "microbatches": 4}, "hardware": {"preset": "h100-80gb"}}))


def test_fsdp_units_itemized_each_microbatch() -> None:
    """Without pp FSDP gathers each unit in the forward and again in the backward and
    reduce-scatters its gradient every microbatch: rows with the unit's bytes, whose
    time times count is what the layer costs price (fsdp_collectives)."""
    problem = _fsdp_problem(1)
    job = problem.hardware.job
    rows = problem_rows(problem)
    cost = compute_costs(job, job.accelerator).layers[0]
    params = cost.params
    gathers = [r for r in rows if r.piece == "layer" and r.collective == "dp all-gather"]
    assert sum(r.count for r in gathers) == 2  # forward, and again in the backward
    assert {r.nbytes for r in gathers} == {params * 2}  # bf16 weights
    rs = row(rows, "dp reduce-scatter", "layer")
    assert (rs.nbytes, rs.ranks, rs.count) == (params * 4, 4, 1)  # fp32 gradients
    assert rs.ms == pytest.approx(ring(4, params * 4))
    comm = fsdp_collectives(job, cost)
    want = sum(c.total_ms for c in (*comm.forward, *comm.backward))
    assert sum(r.ms * r.count for r in rows if r.piece == "layer") == pytest.approx(want)
    hidden = comm.forward[0].exposed_ms < comm.forward[0].total_ms
    assert gathers[0].exposure == ("overlap" if hidden else "exposed")


def test_fsdp_once_a_step_rows_have_their_bytes() -> None:
    """With pp torchtitan gathers once, during the first forward, and reduces once after
    the last backward: the step rows carry the buffers they move."""
    problem = _fsdp_problem(2)
    rows = problem_rows(problem)
    for r in rows:
        if r.piece == "step":
            params = problem.stage_costs[r.pp_ranks[0]].params
            per = 2 if r.collective == "dp all-gather" else 4
            assert r.nbytes == pytest.approx(params * per), r
    assert {r.collective for r in rows if r.piece == "step"} == {"dp all-gather",
                                                                  "dp reduce-scatter"}


def test_step_rows_for_each_pipeline_rank() -> None:
    """Each rank's step collectives are its own stage's: the embedding's rank reduces
    more than a middle one's; ranks alike share rows, every rank listed once."""
    problem = build_problem(cfg({"dp": 2, "num_layers": 8}, {"pp": 4}))
    job = problem.hardware.job
    hw = problem.hardware
    tails = rank_tails(problem.schedule, problem.stage_costs, job, hw.memory_bandwidth_gbps,
                       hw.optimizer_fixed_ms)
    steps = [r for r in problem_rows(problem) if r.piece == "step"]
    assert sorted(i for r in steps for i in r.pp_ranks) == [0, 1, 2, 3]
    for r in steps:
        for i in r.pp_ranks:
            (c,) = tails[i].on_links
            assert (r.ms, r.nbytes) == (c.total_ms, c.nbytes)
    assert len({r.nbytes for r in steps}) > 1


def _policy_problem(stages: list[dict]):
    return build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, "tp": 4, "recompute": "none"},
        "pipeline": {"pp": 2, "microbatches": 4}, "hardware": {"preset": "h100-80gb"},
        "memory": {"stage": stages}}))


def test_counts_follow_each_stages_policy() -> None:
    """Stage 0 recomputes its layers whole, stage 1 nothing: stage 0's layers run their
    forward's gathers again in the backward, and each stage's rows add up to what the
    layer costs price under that stage's recompute."""
    problem = _policy_problem([
        {"stage": 0, "recompute_layers": 2}, {"stage": 1, "recompute_modules": []}])
    job = problem.hardware.job
    rows = problem_rows(problem)
    gathers = {(r.stages, r.exposure): r.count for r in rows if r.piece == "layer"
               and r.collective == "tp all-gather" and r.nbytes == S}
    # each sublayer's input forward, its output gradient backward, stage 0's input again
    # in the recomputed forward; every stage's input again for its weight gradient,
    # beside the input-gradient GEMM
    assert gathers == {((0,), "exposed"): 6, ((1,), "exposed"): 4, ((0, 1), "overlap"): 2}
    a = per_rank_arch(job.arch)
    for stage, full in ((0, True), (1, False)):
        again = recomputed(replace(a, recompute="full" if full else "none"), ())
        cost = compute_costs(job, job.accelerator, (), full).layers[0]
        comm = layer_collectives(job, a, job.accelerator, "dense", cost, again)
        want = sum(c.total_ms for c in (*comm.forward, *comm.backward))
        got = sum(r.ms * r.count for r in rows if r.piece == "layer" and stage in r.stages)
        assert got == pytest.approx(want)


def test_policy_and_ranks_labelled_within_80_columns(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    path = tmp_path / "job.toml"
    path.write_text(
        '[model]\npreset = "llama3-8b"\nnum_layers = 8\ntp = 4\ndp = 2\n'
        '[pipeline]\npp = 4\nmicrobatches = 8\n[hardware]\npreset = "h100-80gb"\n'
        '[[memory.stage]]\nstage = 0\nrecompute_layers = 2\n')
    assert main(["costs", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("collectives, as"):]
    assert "…" not in table and all(len(line) <= 80 for line in table.splitlines())
    assert re.search(r"layer +s0 ", table) and re.search(r"layer +s1-3 ", table)
    assert re.search(r"step r0 ", table)
