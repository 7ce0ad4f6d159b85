"""`ppsim diff`'s collectives inside the ops (ppsim.trace.collectives): the ops both traces
hold a group's collectives in, their median waits and median relative error; a trace's
collective events read and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.trace.collectives import TraceCollective, collective_rows
from ppsim.trace.read import read_trace


def _c(rank: int, op: str, mb: int, group: str, ms: float, iteration: int = 0
       ) -> TraceCollective:
    return TraceCollective(rank=rank, group=group, op=op, stage=rank, microbatch=mb,
                           iteration=iteration, exposed_ms=ms)


def test_rows_by_group_and_op() -> None:
    a = [_c(0, "F", 0, "tp", 1.0), _c(0, "F", 1, "tp", 2.0), _c(0, "F", 2, "tp", 4.0),
         _c(0, "B", 0, "cp", 2.0), _c(1, "F", 0, "cp", 0.0)]
    b = [_c(0, "F", 0, "tp", 1.5), _c(0, "F", 1, "tp", 2.0), _c(0, "F", 2, "tp", 2.0),
         _c(0, "B", 0, "cp", 3.0), _c(1, "F", 0, "cp", 1.0), _c(0, "F", 3, "tp", 9.0)]
    rows = {(r.group, r.op): r for r in collective_rows(a, b)}
    assert list(rows) == [("tp", "F"), ("cp", "F"), ("cp", "B")]  # tp before cp, F before B
    tp = rows["tp", "F"]
    # microbatch 3 is only in B; the three both hold: errors +50 %, 0, -50 %
    assert (tp.count, tp.ms, tp.error) == (3, (2.0, 2.0), 0.0)
    assert rows["cp", "B"].error == pytest.approx(0.5)
    assert rows["cp", "F"].error is None  # A waited for nothing: no ratio


@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=20), st.floats(0.1, 10.0))
def test_a_scaled_trace_reads_its_scale(waits: list[float], scale: float) -> None:
    a = [_c(0, "F", i, "ep", w) for i, w in enumerate(waits)]
    b = [_c(0, "F", i, "ep", w * scale) for i, w in enumerate(waits)]
    (row,) = collective_rows(a, b)
    assert row.count == len(waits)
    assert row.error == pytest.approx(scale - 1, rel=1e-9, abs=1e-12)
    assert row.ms[1] == pytest.approx(row.ms[0] * scale)


def _trace(tmp_path: Path, collective: dict, name: str = "t.json") -> Path:
    op = {"name": "F0", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
          "dur": 10.0, "args": {"kind": "F", "stage": 0, "chunk": 0, "microbatch": 0}}
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": [op, collective]}))
    return path


def test_a_trace_reads_its_collectives(tmp_path: Path, capsys) -> None:
    ev = {"name": "cp K/V ring", "cat": "collective", "ph": "X", "pid": 0, "tid": 2,
          "ts": 0.0, "dur": 3.0, "args": {"group": "cp", "op": "F", "stage": 0,
                                          "microbatch": 0, "iteration": 0,
                                          "total_ms": 0.003, "exposed_ms": 0.003}}
    t = read_trace(str(_trace(tmp_path, ev)))
    (got,) = t.collectives
    assert (got.key, got.exposed_ms, got.start_us, got.dur_us) == (
        (0, "F", 0, 0, "cp"), 0.003, 0.0, 3.0)
    bad = dict(ev, args=dict(ev["args"], group="xp"))
    assert main(["diff", str(_trace(tmp_path, bad, "bad.json")), str(_trace(tmp_path, ev))]) == 2
    err = capsys.readouterr().err
    assert "collective event 1: group must be one of tp, cp, ep, dp" in err


def test_the_diff_picture_draws_each_ops_collectives(tmp_path: Path) -> None:
    """`ppsim diff --png`'s lanes: the ops, and their collectives as strips (kind C) where
    the trace drew them."""
    from ppsim.cli.diff import lanes
    from ppsim.trace.diff import diff_traces

    ev = {"name": "ep all-to-all", "cat": "collective", "ph": "X", "pid": 0, "tid": 2,
          "ts": 2000.0, "dur": 4000.0, "args": {"group": "ep", "op": "F", "stage": 0,
                                                "microbatch": 0, "exposed_ms": 4.0}}
    op = {"name": "F0", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 1000.0,
          "dur": 10000.0, "args": {"kind": "F", "stage": 0, "chunk": 0, "microbatch": 0}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [op, ev]}))
    t = read_trace(str(path))
    (lane,) = lanes(diff_traces(t, t).a)
    assert sorted(lane) == [(0.0, 10.0, "F", 0), (1.0, 4.0, "C", 0)]
    path.write_text(json.dumps({"traceEvents": [op]}))
    assert lanes(diff_traces(*[read_trace(str(path))] * 2).a) == [[(0.0, 10.0, "F", 0)]]
