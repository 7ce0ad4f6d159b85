"""A loaded trace's collectives (a run's, as it timed them inside each op): a lane under
each of its ranks' lanes, `rcomm1` under `real1`, shown and hidden with the simulated
ones (C)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppsim.cli.main import main
from ppsim.trace.read import read_trace
from ppsim.tui.app import PPSimApp
from ppsim.tui.comm_lanes import trace_comm_lanes
from ppsim.tui.testing import settle
from ppsim.tui.timeline import Timeline


def _with_collectives(tmp_path: Path) -> Path:
    """The embedded default's simulated trace, each F op holding a tp collective over its
    first quarter, as `ppsim run` records one (iteration 0)."""
    sim = tmp_path / "sim.json"
    assert main(["simulate", "--trace", str(sim)]) == 0
    doc = json.loads(sim.read_text())
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "compute"
           and e["args"]["kind"] == "F"]
    for e in ops:
        a = e["args"]
        doc["traceEvents"].append({
            "name": "tp all-gather / reduce-scatter", "cat": "collective", "ph": "X",
            "pid": e["pid"], "tid": 2, "ts": e["ts"], "dur": e["dur"] / 4,
            "args": {"group": "tp", "op": "F", "stage": a["stage"],
                     "microbatch": a["microbatch"], "iteration": 0,
                     "total_ms": e["dur"] / 4e3, "exposed_ms": e["dur"] / 4e3}})
    out = tmp_path / "run.json"
    out.write_text(json.dumps(doc))
    return out


def test_each_rank_gets_a_lane_of_its_timed_collectives(tmp_path: Path) -> None:
    trace = read_trace(str(_with_collectives(tmp_path)))
    lanes = trace_comm_lanes(trace, 0)
    ranks = sorted({o.rank for o in trace.ops})
    assert [(lane.label, lane.rank, lane.source) for lane in lanes] == [
        (f"rcomm{r}", r, "comm") for r in ranks]
    t0 = min(o.start_us for o in trace.ops)
    for lane in lanes:
        forwards = sorted((o for o in trace.ops if o.rank == lane.rank and o.kind == "F"),
                          key=lambda o: o.start_us)
        assert len(lane.ops) == len(forwards)
        for strip, op in zip(lane.ops, forwards, strict=True):
            assert strip.kind == "C" and strip.microbatch == op.microbatch
            assert strip.start == pytest.approx((op.start_us - t0) / 1e3)
            assert strip.end - strip.start == pytest.approx(op.dur_us / 4e3)
    assert trace_comm_lanes(trace, 5) == []  # an iteration the trace lacks


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_timeline_draws_them_under_the_real_lanes(tmp_path: Path, size) -> None:
    app = PPSimApp(trace_path=str(_with_collectives(tmp_path)))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        tl = app.query_one(Timeline)
        assert [lane.label for lane in tl.lanes] == ["r0", "real0", "rcomm0", "r1", "real1",
                                                     "rcomm1"]
        await pilot.press("C")
        await settle(pilot)
        assert [lane.label for lane in tl.lanes] == ["r0", "real0", "r1", "real1"]
