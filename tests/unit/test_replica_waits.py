"""A run's step reduce (R) waits for the last replica to reach it: the executor marks that
wait on replica 0's R events (args.replica_wait_us), the trace keeps it, and ppsim diff
says how much of the longest rank's R it was."""

from __future__ import annotations

import copy
import json

import pytest
from helpers import uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.errors import UserError
from ppsim.sim.simulate import simulate
from ppsim.trace.diff import diff_traces
from ppsim.trace.read import trace_from_json
from ppsim.trace.schema import compute_event, simulation_trace

pytest.importorskip("torch")
from ppsim.executor.recorder import mark_replica_waits  # noqa: E402


def _r(rank: int, iteration: int, ts: float, dur: float) -> dict:
    return compute_event(rank, "R", -1, -1, -1, iteration, ts, dur)


def _parts(starts: list[list[list[float]]], dur: float = 50.0) -> list[dict]:
    """Every global rank's part, Megatron's order (tp 1): starts[replica][pipeline rank]
    lists each R op's start in iteration 0."""
    return [{"events": [_r(r, 0, t, dur) for t in ranks_starts]}
            for d in starts for r, ranks_starts in enumerate(d)]


def test_each_r_of_replica_0_waits_for_its_own_ranks_last_replica() -> None:
    # pp 2, dp 3; rank 0 reduces then gathers (two R ops), rank 1 once.
    parts = _parts([[[100.0, 300.0], [110.0]],
                    [[130.0, 290.0], [105.0]],
                    [[120.0, 320.0], [190.0]]])
    mark_replica_waits(parts, pp=2, tp=1, dp=3)
    waits = [[e["args"]["replica_wait_us"] for e in p["events"]] for p in parts[:2]]
    # Rank 0: the last replica started at 130 and 320; rank 1: at 190, past the R's 50 us.
    assert waits == [[30.0, 20.0], [50.0]]
    # The other replicas' parts are not traced: they keep no mark.
    assert all("replica_wait_us" not in e["args"] for p in parts[2:] for e in p["events"])


def test_one_replica_waits_for_none() -> None:
    parts = _parts([[[100.0]]])
    mark_replica_waits(parts, pp=1, tp=1, dp=1)
    assert "replica_wait_us" not in parts[0]["events"][0]["args"]


@settings(max_examples=100, deadline=None)
@given(starts=st.lists(st.floats(min_value=0, max_value=1e6), min_size=2, max_size=6),
       dur=st.floats(min_value=0, max_value=1e5))
def test_a_wait_is_never_negative_nor_longer_than_the_op(starts: list[float],
                                                         dur: float) -> None:
    parts = _parts([[[t]] for t in starts], dur)
    mark_replica_waits(parts, pp=1, tp=1, dp=len(starts))
    wait = parts[0]["events"][0]["args"]["replica_wait_us"]
    assert 0.0 <= wait <= dur
    assert wait == min(max(starts) - starts[0], dur)


@pytest.fixture
def run_doc() -> dict:
    """A simulated trace given one R op per rank, as a data-parallel run records them."""
    problem = uniform_problem(2, 1, 4, "1f1b", counts=[3, 2], f=1.0, b=2.0, act=10, static=5)
    doc = simulation_trace(simulate(problem))
    end = max(e["ts"] + e["dur"] for e in doc["traceEvents"] if e.get("cat") == "compute")
    for rank, (dur, wait) in enumerate([(400.0, 150.0), (900.0, 600.0)]):
        ev = _r(rank, 0, end, dur)
        ev["args"]["replica_wait_us"] = wait
        doc["traceEvents"].append(ev)
    return doc


def test_diff_reports_the_longest_ranks_wait(run_doc: dict, tmp_path, capsys) -> None:
    plain = copy.deepcopy(run_doc)
    for e in plain["traceEvents"]:
        e.get("args", {}).pop("replica_wait_us", None)
    d = diff_traces(trace_from_json(plain, "a"), trace_from_json(run_doc, "b")).to_dict()
    assert d["step_ops_ms"]["R"] == [0.9, 0.9]
    assert d["step_wait_ms"]["R"] == [0.0, 0.6]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(plain))
    b.write_text(json.dumps(run_doc))
    assert main(["diff", str(a), str(b)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "waiting for the last replica to start it: B 0.600 ms" in out


def test_a_wait_longer_than_its_op_is_refused(run_doc: dict) -> None:
    ev = run_doc["traceEvents"][-1]
    ev["args"]["replica_wait_us"] = ev["dur"] + 1
    with pytest.raises(UserError, match="args.replica_wait_us"):
        trace_from_json(run_doc, "bad")
