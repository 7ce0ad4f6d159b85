"""A job's tensor-, context- and expert-parallel collectives in the simulated Chrome trace
(issue 24, item 6): their own events on a communication lane per rank, inside the ops
that run them, their exposed part what the ops wait for."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import transformer_costs
from ppsim.job.layers import per_rank_arch
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.trace.schema import COLLECTIVE_TID, simulation_trace

NV, NV_STEP = 450e6, 1e-3  # NVLink bytes per ms, ms per step


def problem(model: dict, pipe: dict | None = None):
    return build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, **model},
        "pipeline": {"pp": 2, "microbatches": 4, **(pipe or {})},
        "hardware": {"preset": "h100-80gb"}}))


def collectives(p) -> list[dict]:
    doc = simulation_trace(simulate(p))
    return [e for e in doc["traceEvents"] if e.get("cat") == "collective"]


def test_tensor_parallel_collectives_have_their_own_lane() -> None:
    events = collectives(problem({"tp": 4}))
    # One tp event in each F and B: 2 stages x 4 microbatches x 2 directions.
    assert len(events) == 16
    assert {e["tid"] for e in events} == {COLLECTIVE_TID}
    s = 8192 * 4096 * 2  # one microbatch's hidden states, bf16
    one = 3 * NV_STEP + 3 / 4 * s / NV  # all-gather or reduce-scatter over 4 GPUs of a node
    by_stage = {(e["args"]["stage"], e["args"]["op"]): e["args"] for e in events}
    # Stage 0: 2 layers of 4 collectives forward and 6 backward (Megatron gathers each
    # sublayer's input again for its weight gradient), and the embedding's scatter (its
    # gradient's gather); stage 1 the same with the head's gather (backward: its
    # gradient's scatter and its input's gather again). Each layer's backward runs its
    # 2 gathers of the inputs again and its 2 scatters of their gradients beside the
    # gathered linears' GEMMs, which outlast them: it waits for NCCL's 16 of the 132 SMs
    # there; the rest it waits for whole. The head's backward pair runs beside its
    # logits' GEMMs so too (Megatron's output layer is a ColumnParallelLinear).
    waits = {"F": 4 * one, "B": 2 * one + 4 * 16 / 132 * one}
    for (stage, op), n in {(0, "F"): 9, (1, "F"): 9, (0, "B"): 13, (1, "B"): 14}.items():
        args = by_stage[(stage, op)]
        assert args["total_ms"] == pytest.approx(n * one)
        edge = n - 2 * (4 if op == "F" else 6)  # the embedding's or the head's
        edge_waits = 16 / 132 * edge * one if (stage, op) == (1, "B") else edge * one
        assert args["exposed_ms"] == pytest.approx(2 * waits[op] + edge_waits)


def test_overlapped_collectives_are_shown_but_not_waited_for() -> None:
    """Transformer Engine's userbuffers (TE's initialize_ub defaults): each layer's compute
    hides its collectives but the last of 4 chunks of each forward reduce-scatter (the
    `pipeline` method), and the reduce-scatters it hides hold 16 of the H100's 132 SMs
    from it (the all-gathers go by the copy engines); the embedding's collectives and the
    head's forward gather are not hidden, the head's backward pair runs beside its GEMMs
    (no userbuffers: Megatron's own ColumnParallelLinear)."""
    events = collectives(problem({"tp": 4}, {"tp_comm_overlap": True}))
    s = 8192 * 4096 * 2
    one = 3 * NV_STEP + 3 / 4 * s / NV
    share = 16 / 132
    # Per layer, each way: 2 all-gathers and 2 reduce-scatters of `one` each, and in the
    # backward 2 more all-gathers of the inputs, TE's `bulk` method on 16 SMs too.
    tails = 2 * one / 4
    forward = tails + share * (2 * one - tails)  # the scatters' chunks the GEMM hides
    backward = share * 4 * one
    for e in events:
        f = e["args"]["op"] == "F"
        edge = 1 if f else 1 + e["args"]["stage"]  # the head gathers its input again
        assert e["args"]["total_ms"] == pytest.approx((8 if f else 12) * one + edge * one)
        layer = forward if f else backward
        head = not f and e["args"]["stage"] == 1
        edge_waits = share * edge * one if head else edge * one
        assert e["args"]["exposed_ms"] == pytest.approx(edge_waits + 2 * layer)


def test_a_lone_replica_has_no_collective_lane() -> None:
    doc = simulation_trace(simulate(problem({})))
    assert not [e for e in doc["traceEvents"] if e.get("cat") == "collective"
                or e.get("tid") == COLLECTIVE_TID]


@settings(max_examples=12, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2, 4]),
       overlap=st.booleans(), gpus_per_node=st.sampled_from([2, 8]))
def test_exposed_collectives_are_what_each_stage_adds_to_its_compute(
        tp: int, cp: int, overlap: bool, gpus_per_node: int) -> None:
    """Each F and B's exposed collectives (plus, with cp, the other chunks' attention) are
    the job's stage time less the stage's compute alone, and every event lies inside
    its op."""
    p = build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, "tp": tp, "cp": cp},
        "pipeline": {"pp": 2, "microbatches": 2, "tp_comm_overlap": overlap and tp > 1},
        "hardware": {"preset": "h100-80gb", "gpus_per_node": gpus_per_node}}))
    sim = simulate(p)
    doc = simulation_trace(sim)
    # The ops' own (the step's, op R, are test_job_step_lanes.py's).
    events = [e for e in doc["traceEvents"] if e.get("cat") == "collective"
              and e["args"]["op"] != "R"]
    if tp == 1 and cp == 1:
        assert not events
        return
    ops = {(e["args"]["stage"], e["args"]["microbatch"], e["args"]["kind"]): e
           for e in doc["traceEvents"] if e.get("cat") == "compute"
           and e["args"]["stage"] >= 0}
    for e in events:
        op = ops[(e["args"]["stage"], e["args"]["microbatch"], e["args"]["op"])]
        assert op["pid"] == e["pid"]
        assert op["ts"] - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + 1e-3
    a = per_rank_arch(p.hardware.job.arch)
    alone = transformer_costs(a, p.hardware.job.accelerator)
    cfg_costs = p.stage_costs
    for stage, c in enumerate(cfg_costs):
        mine = [e["args"] for e in events
                if e["args"]["stage"] == stage and e["args"]["microbatch"] == 0]
        base_f = sum(x.forward_ms for x in alone.layers[2 * stage:2 * stage + 2]) + (
            alone.embedding.forward_ms if stage == 0 else alone.head.forward_ms)
        extra_f = c.forward_ms - base_f
        shown = sum(x["exposed_ms"] for x in mine if x["op"] == "F" and x["group"] != "cp")
        cp_attention = extra_f - shown  # the rest: the other chunks' attention + its ring
        ring = [x for x in mine if x["op"] == "F" and x["group"] == "cp"]
        if cp == 1:
            assert cp_attention == pytest.approx(0.0, abs=1e-9)
        else:
            assert cp_attention >= ring[0]["exposed_ms"] - 1e-9


def test_simulate_trace_writes_the_lane(tmp_path, capsys) -> None:
    out = tmp_path / "t.json"
    assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp", "2",
                 "--pp", "2", "--microbatches", "2", "--trace", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("tid") == COLLECTIVE_TID}
    assert names == {"collectives"}
    assert any(e.get("cat") == "collective" for e in doc["traceEvents"])


def test_the_png_timeline_draws_collectives_as_strips(tmp_path, capsys) -> None:
    from PIL import Image  # Pillow: what the picture is drawn with

    from ppsim.cli.picture import COLOURS

    def strip_pixels(tp: int) -> int:
        out = tmp_path / f"tp{tp}.png"
        assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp",
                     str(tp), "--pp", "2", "--microbatches", "2", "--png", str(out)]) == 0
        capsys.readouterr()
        img = Image.open(out).convert("RGB")
        return sum(n for n, colour in img.getcolors(1 << 20) if colour == COLOURS["C"])

    assert strip_pixels(1) == 0
    assert strip_pixels(4) > 0


def test_the_png_timeline_ends_with_the_step_tail(tmp_path, capsys) -> None:
    """The data-parallel reduce (R) and the optimizer step (S) close each rank's lane, as
    the trace writes them; before, the picture stopped at the last op, short of the
    iteration its title gives."""
    from PIL import Image

    from ppsim.cli.picture import COLOURS

    def pixels(dp: int) -> dict[str, int]:
        out = tmp_path / f"dp{dp}.png"
        assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp",
                     "2", "--microbatches", "2", "--dp", str(dp), "--png", str(out)]) == 0
        capsys.readouterr()
        colours = {c: n for n, c in Image.open(out).convert("RGB").getcolors(1 << 20)}
        return {k: colours.get(COLOURS[k], 0) for k in ("R", "S")}

    alone = pixels(1)
    assert alone["R"] == 0 and alone["S"] > 0
    assert pixels(4)["R"] > 0
