"""Issue 27, defects 5 and 9: formats that meet (`costs --json` is a cost file, cost
files carry MTP layers) and calibrate in one pass over the trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppsim.cli.main import main
from ppsim.trace.calibrate import by_iteration, op_timings, schedule_from_trace
from ppsim.trace.read import trace_from_json

MTP = '[model]\npreset = "tiny-gpt"\nmtp_layers = 1\nposition = "rotary"\n'
"""tiny-gpt with an MTP layer, on rotary positions (Megatron's MTP refuses learned ones)."""


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flags", [[], ["--preset", "deepseek-v3", "--hardware",
                                         "h200-141gb", "--pp", "8"]])
def test_costs_json_is_a_cost_file_that_simulates_alike(tmp_path, capsys, flags) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(_json(capsys, ["costs", *flags])))
    analytic = _json(capsys, ["simulate", *flags])
    measured = _json(capsys, ["simulate", *flags, "--costs", str(path)])
    assert measured["iteration_time_ms"] == pytest.approx(analytic["iteration_time_ms"])
    assert measured["iteration_time_ms"] > 0


def test_calibrate_of_an_mtp_model_writes_mtp_entries_it_can_read(tmp_path, capsys) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(MTP)
    trace, out = tmp_path / "sim.json", tmp_path / "cal.json"
    assert main(["simulate", "--config", str(cfg), "--trace", str(trace)]) == 0
    capsys.readouterr()
    cal = _json(capsys, ["calibrate", str(trace), "--config", str(cfg), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert len(doc["mtp"]) == 1 and doc["mtp"][0]["forward_ms"] > 0
    again = _json(capsys, ["simulate", "--config", str(cfg), "--costs", str(out)])
    # Calibrated on its own simulation: the costs reproduce the iteration it measured.
    assert again["iteration_time_ms"] == pytest.approx(cal["predicted_after_ms"])


def test_a_cost_file_without_mtp_entries_is_refused_for_an_mtp_model(tmp_path,
                                                                      capsys) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(_json(capsys, ["costs", "--preset", "tiny-gpt",
                                              "--position-embedding-type", "rope"])))
    cfg = tmp_path / "c.toml"
    cfg.write_text(MTP)
    assert main(["simulate", "--config", str(cfg), "--costs", str(path)]) == 2
    err = capsys.readouterr().err
    assert "mtp" in err and "no MTP entries" in err and err.count("\n") == 1


def _repeated(doc: dict, iterations: int) -> dict:
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "compute"]
    length = max(e["ts"] + e["dur"] for e in ops) * 1.1
    events = [{**e, "ts": e["ts"] + i * length, "args": {**e["args"], "iteration": i}}
              for i in range(iterations) for e in ops]
    return {"traceEvents": events, "otherData": doc["otherData"]}


def test_op_timings_of_repeated_iterations_repeat_those_of_one(tmp_path: Path,
                                                                 capsys) -> None:
    path = tmp_path / "sim.json"
    assert main(["simulate", "--trace", str(path)]) == 0
    capsys.readouterr()
    doc = json.loads(path.read_text())
    one = trace_from_json(_repeated(doc, 1))
    many = trace_from_json(_repeated(doc, 7))
    assert sorted(by_iteration(many)) == list(range(7))
    sched = schedule_from_trace(one, 0)
    t1, d1 = op_timings(one, [0], sched)
    t7, d7 = op_timings(many, list(range(7)), sched)
    assert len(t7) == 7 * len(t1) and len(d7) == 7 * len(d1)
    per_op = sorted(t.effective_ms for t in t1)
    assert sorted(t.effective_ms for t in t7) == pytest.approx(sorted(per_op * 7))


def test_plan_json_seconds_is_the_whole_commands_wall_time() -> None:
    import subprocess
    import sys
    import time

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", "-m", "ppsim.cli", "plan", "--preset",
                           "tiny-gpt", "--search", "schedule,vpp", "--time-budget", "3",
                           "--json"], capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    out = json.loads(proc.stdout)
    assert len(out["variants"]) > 3
    # Every variant's set-up and search (and the start-up), not the chosen one's search.
    assert 0.6 * wall <= out["seconds"] <= wall
