"""The step's data-parallel collectives on the links (issue 24, item 6: "DP buckets on the
network while the backward computes, shown in the timeline and the traces"): the
gradient reduce-scatter beside the last backward, the parameter gather beside the first
forward, in the Chrome trace, the PNG and the TUI's collectives lane, what they expose
the step's R."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.trace.read import read_trace
from ppsim.trace.schema import COLLECTIVE_TID, simulation_trace
from ppsim.tui.comm_lanes import comm_lanes, trace_comm_lanes

NV, NIC, NIC_STEP = 450e6, 50e6, 5e-3  # bytes per ms, ms per ring step (h100-80gb)
EMBEDDING = 128256 * 4096  # Llama 3's table: the bucket reduced last and gathered first


def cfg(model: dict, pipe: dict | None = None, hw: dict | None = None):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, **model},
                             "pipeline": {"pp": 1, "microbatches": 4, **(pipe or {})},
                             "hardware": {"preset": "h100-80gb", **(hw or {})}})


def step_events(sim) -> dict[int, dict[str, dict]]:
    """Per rank, the trace's step collectives by name."""
    out: dict[int, dict[str, dict]] = {}
    for e in simulation_trace(sim)["traceEvents"]:
        if e.get("cat") == "collective" and e["args"]["op"] == "R":
            out.setdefault(e["pid"], {})[e["name"]] = e
    return out


def ring(n_bytes: float) -> float:
    """A reduce-scatter or all-gather over dp 16 on two nodes, 8 a node: rings through the
    node's 8 NICs, capped by NVLink (as tests/unit/test_job_comm.py)."""
    return 15 * NIC_STEP + 15 / 16 * n_bytes / min(NV, 8 * NIC)


def test_the_buckets_run_while_the_last_backward_computes() -> None:
    problem = build_problem(cfg({"dp": 16, "distributed_optimizer": True},
                                {"overlap_grad_reduce": True, "overlap_param_gather": True}))
    sim = simulate(problem)
    params = sum(c.params for c in problem.stage_costs)
    ops = sim.timeline.ops[0]
    last_b = max((o for o in ops if o.action.kind == "B"), key=lambda o: o.end)
    end = sim.timeline.step[0][0]
    events = step_events(sim)[0]
    rs = events["dp gradient reduce-scatter"]
    assert rs["tid"] == COLLECTIVE_TID and rs["args"]["stage"] == -1
    assert rs["dur"] / 1e3 == pytest.approx(ring(params * 4), rel=1e-9)
    # Nothing hides the embedding's bucket, the last: the buckets end that long after
    # the last op, and began inside the last backward.
    floor = ring(EMBEDDING * 4)
    assert (rs["ts"] + rs["dur"]) / 1e3 == pytest.approx(end + floor, rel=1e-9)
    assert rs["args"]["exposed_ms"] == pytest.approx(floor, rel=1e-9)
    assert last_b.start - 1e-9 <= rs["ts"] / 1e3 < end
    ag = events["dp parameter all-gather"]
    assert ag["ts"] == pytest.approx(ops[0].start * 1e3)
    assert ag["dur"] / 1e3 == pytest.approx(ring(params * 2), rel=1e-9)
    assert ag["args"]["exposed_ms"] == pytest.approx(ring(EMBEDDING * 2), rel=1e-9)


def test_without_the_overlaps_they_follow_the_last_op_and_fill_the_steps_R() -> None:
    sim = simulate(build_problem(cfg({"dp": 16, "distributed_optimizer": True})))
    end, reduce, _ = sim.timeline.step[0]
    events = step_events(sim)[0]
    rs, ag = events["dp gradient reduce-scatter"], events["dp parameter all-gather"]
    assert rs["ts"] / 1e3 == pytest.approx(end)
    assert ag["ts"] == pytest.approx(rs["ts"] + rs["dur"])
    assert (ag["ts"] + ag["dur"]) / 1e3 == pytest.approx(end + reduce, rel=1e-12)
    assert rs["args"]["exposed_ms"] == pytest.approx(rs["dur"] / 1e3)


def test_a_lone_replica_has_no_step_collectives() -> None:
    assert step_events(simulate(build_problem(cfg({"dp": 1})))) == {}


@settings(max_examples=30, deadline=None)
@given(dp=st.sampled_from([2, 4, 8, 16, 64]), pp=st.sampled_from([1, 2, 4]),
       optimizer=st.sampled_from(["ddp", "distributed", "fsdp"]), grad=st.booleans(),
       gather=st.booleans(), tied=st.booleans(), per_node=st.sampled_from([2, 8]))
def test_what_the_lanes_expose_is_the_steps_R(dp: int, pp: int, optimizer: str, grad: bool,
                                              gather: bool, tied: bool,
                                              per_node: int) -> None:
    """With no SMs held by NCCL, a rank's R is exactly what its step collectives leave
    unhidden (FSDP's: those it runs once a step); each runs inside the iteration, a
    gradient one ends its unhidden part after the last op, a gather beside the forward
    starts with the first op."""
    fsdp = optimizer == "fsdp"
    sharded = optimizer == "distributed"
    problem = build_problem(cfg(
        {"dp": dp, "distributed_optimizer": sharded, "fsdp": fsdp, "tie_embeddings": tied},
        {"pp": pp, "microbatches": 2 * pp, "overlap_grad_reduce": grad and not fsdp,
         "overlap_param_gather": gather and sharded and grad},
        {"collective_sms": 0, "gpus_per_node": per_node}))
    sim = simulate(problem)
    events = step_events(sim)
    if not fsdp:
        assert set(events) == set(range(pp))
    for r, (end, reduce, _) in enumerate(sim.timeline.step):
        mine = events.get(r, {}).values()
        wait = sim.timeline.sync_waits[r]  # idle at the tied all-reduce: no collective's
        assert sum(e["args"]["exposed_ms"] for e in mine) + wait == pytest.approx(reduce,
                                                                                 rel=1e-9)
        for e in mine:
            start, stop = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
            assert 0.0 <= start <= stop <= sim.summary.iteration_time_ms + 1e-6
            assert e["args"]["exposed_ms"] <= e["dur"] / 1e3 + 1e-9
            if e["name"].startswith("dp gradient"):
                assert stop == pytest.approx(end + e["args"]["exposed_ms"], rel=1e-9)
            if e["name"] == "dp parameter all-gather" and (fsdp or gather and grad):
                assert start == pytest.approx(sim.timeline.ops[r][0].start)


def test_the_trace_reads_back_and_the_tui_draws_them(tmp_path, capsys) -> None:
    out = tmp_path / "t.json"
    assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
                 "--microbatches", "4", "--dp", "8", "--use-distributed-optimizer",
                 "--overlap-grad-reduce", "--overlap-param-gather",
                 "--trace", str(out)]) == 0
    capsys.readouterr()
    trace = read_trace(str(out))
    steps = [c for c in trace.collectives if c.op == "R"]
    assert {(c.rank, c.group, c.stage, c.microbatch) for c in steps} == {
        (r, "dp", -1, -1) for r in (0, 1)}
    real = trace_comm_lanes(trace, 0)
    assert [lane.label for lane in real] == ["rcomm0", "rcomm1"]
    assert {op.kind for lane in real for op in lane.ops} == {"D"}
    # The session's own lanes: a tp 1 job has no collectives inside its ops, but a lane
    # for its step's.
    sim = simulate(build_problem(cfg({"dp": 8, "distributed_optimizer": True},
                                     {"pp": 2, "overlap_grad_reduce": True})))
    lanes = comm_lanes(sim)
    assert [lane.label for lane in lanes] == ["comm0", "comm1"]
    for lane, ops in zip(lanes, sim.timeline.ops, strict=True):
        assert {op.kind for op in lane.ops} == {"D"}
        assert max(op.end for op in lane.ops) > ops[-1].end


def test_the_png_draws_them_in_their_own_colour(tmp_path, capsys) -> None:
    from PIL import Image

    from ppsim.cli.picture import COLOURS

    def pixels(dp: int) -> int:
        out = tmp_path / f"dp{dp}.png"
        assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp",
                     "2", "--microbatches", "2", "--dp", str(dp), "--use-distributed-optimizer",
                     "--overlap-grad-reduce", "--png", str(out)]) == 0
        capsys.readouterr()
        colours = {c: n for n, c in Image.open(out).convert("RGB").getcolors(1 << 20)}
        return colours.get(COLOURS["D"], 0)

    assert pixels(1) == 0
    assert pixels(8) > 0


@pytest.mark.parametrize("with_step", [False, True])
def test_a_gather_beside_the_other_chunks_steps_exposes_what_R_holds(with_step: bool) -> None:
    """--overlap-param-gather-with-optimizer-step: the first chunk's gather hides behind
    the other chunks' steps, the rest behind the forward; one gather on the lane, its
    unhidden part R's share (no SMs held, a slow step to hide behind)."""
    problem = build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 8, "dp": 16,
                  "distributed_optimizer": True},
        "pipeline": {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "microbatches": 4,
                     "overlap_grad_reduce": True, "overlap_param_gather": True,
                     "overlap_param_gather_with_optimizer_step": with_step},
        "hardware": {"preset": "h100-80gb", "collective_sms": 0, "memory_bandwidth_gbps": 1}}))
    sim = simulate(problem)
    events = step_events(sim)
    for r, (_, reduce, _) in enumerate(sim.timeline.step):
        gathers = [e for e in events[r].values() if e["name"] == "dp parameter all-gather"]
        assert len(gathers) == 1
        assert gathers[0]["ts"] == pytest.approx(sim.timeline.ops[r][0].start * 1e3)
        assert sum(e["args"]["exposed_ms"] for e in events[r].values()) \
            == pytest.approx(reduce, rel=1e-9)


def test_simulate_json_lists_them(capsys) -> None:
    """`simulate --json`'s step_collectives: what the trace draws, with what each runs
    beside (null: after the last op)."""
    assert main(["simulate", "--preset", "llama3-8b", "--num-layers", "4", "--hardware",
                 "h100-80gb", "--pp", "1", "--microbatches", "4", "--dp", "16",
                 "--use-distributed-optimizer", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["step_collectives"]
    sim = simulate(build_problem(cfg({"dp": 16, "distributed_optimizer": True},
                                     {"overlap_grad_reduce": True,
                                      "overlap_param_gather": True})))
    drawn = step_events(sim)[0]
    assert [(c["rank"], c["what"], c["beside"]) for c in got] == [
        (0, "gradient reduce-scatter", "backward"), (0, "parameter all-gather", "forward")]
    for c in got:
        e = drawn[f"dp {c['what']}"]
        assert c["ms"] == pytest.approx(e["dur"] / 1e3)
        assert c["exposed_ms"] == pytest.approx(e["args"]["exposed_ms"])
    assert got[0]["ms"] == pytest.approx(ring(sum(c.params for c in sim.problem.stage_costs)
                                              * 4), rel=1e-9)


def test_the_tied_all_reduce_is_named_for_the_stages_it_joins() -> None:
    """GPT-3's tied table at pp 2, one replica: its gradient's all-reduce joins the first
    and last stage (Megatron's embedding group); no data-parallel group runs it."""
    sim = simulate(build_problem(config_from_dict({
        "model": {"preset": "gpt3-1.3b", "num_layers": 4},
        "pipeline": {"pp": 2, "microbatches": 4}, "hardware": {"preset": "h100-80gb"}})))
    events = step_events(sim)
    assert sorted(events) == [0, 1]
    for rank in (0, 1):
        assert list(events[rank]) == ["embedding gradient all-reduce"]
