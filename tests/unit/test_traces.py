"""The recorded traces in traces/: real executor runs, each with its config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import load_config
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.trace.diff import diff_traces
from ppsim.trace.read import read_trace, trace_from_json
from ppsim.trace.schema import simulation_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
CASES = sorted(p for p in TRACES.iterdir() if (p / "real.json").exists())


def test_there_are_recorded_traces_of_1f1b_and_interleaved():
    schedules = {read_trace(str(c / "real.json")).info["schedule"] for c in CASES}
    assert {"1f1b", "interleaved-1f1b"} <= schedules


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_simulating_the_config_matches_every_real_op(case):
    real = read_trace(str(case / "real.json"))
    assert real.info["source"] == "executor"
    problem = build_problem(load_config(str(case / "config.toml")))
    assert list(problem.split.counts) == real.info["split"]
    sim = trace_from_json(simulation_trace(simulate(problem)), "sim")
    d = diff_traces(sim, real).to_dict()
    assert d["ops_only_in"] == [0, 0]
    assert d["ops_matched"] == 2 * problem.split.num_stages * problem.schedule.microbatches
    # Memory is bookkeeping, not timing: exact on every rank (each stage fed by another
    # rank holds the boundary tensor it received, as the executor does).
    for r in d["ranks"]:
        pred, meas = r["peak_memory_bytes"]
        assert pred == meas, (r["rank"], pred, meas)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_cli_diff_of_recorded_sim_and_real(case, capsys):
    assert main(["diff", str(case / "sim.json"), str(case / "real.json"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ops_only_in"] == [0, 0] and d["ops_matched"] > 0
    real = read_trace(str(case / "real.json"))
    assert d["iterations"][1] >= real.info["warmup_iterations"]  # a steady-state iteration


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_calibrating_a_recorded_run_against_another_model_is_refused(case, tmp_path, capsys):
    """calibrate fitted the recorded tiny-llm run's times onto another model's costs (its
    FLOPs an iteration differ) and wrote the result as if it were the run's."""
    real = str(case / "real.json")
    other = tmp_path / "other.toml"
    other.write_text('[model]\npreset = "tiny-gpt"\n[hardware]\npreset = "cpu"\n')
    assert main(["calibrate", real, "--config", str(other),
                 "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "--config: " in err and "was recorded for another model" in err
    assert err.count("\n") == 1 and not (tmp_path / "c.json").exists()
    # The run's own config calibrates.
    assert main(["calibrate", real, "--config", str(case / "config.toml"),
                 "--out", str(tmp_path / "own.json")]) == 0


def test_calibrating_a_run_with_an_op_missing_from_a_steady_iteration_is_refused(
        tmp_path, capsys):
    """An iteration before the last lacking an op: its time would sit in the gap before
    the rank's next op and be fitted as that op's, so no cost file is written."""
    case = TRACES / "1f1b-5-3-m8"
    doc = json.loads((case / "real.json").read_text())
    last = doc["otherData"]["iterations"] - 1
    assert last - 1 >= doc["otherData"]["warmup_iterations"]
    gone = [e for e in doc["traceEvents"] if e.get("cat") == "compute"
            and e["args"]["iteration"] == last - 1 and e["pid"] == 1
            and e["args"]["kind"] == "F" and e["args"]["microbatch"] == 3]
    assert len(gone) == 1
    doc["traceEvents"].remove(gone[0])
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(doc))
    out = tmp_path / "c.json"
    assert main(["calibrate", str(cut), "--config", str(case / "config.toml"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"iteration {last - 1} has 31 ops" in err
    assert not out.exists()


def test_calibrate_says_a_free_link_is_unlimited_not_zero_gb_per_s(tmp_path, capsys):
    """The recorded run's receivers start as their senders end: no delay, so the file's
    link takes no time on the wire (bandwidth 0), said as unlimited."""
    case = TRACES / "1f1b-5-3-m8"
    out = tmp_path / "c.json"
    assert main(["calibrate", str(case / "real.json"), "--config", str(case / "config.toml"),
                 "--out", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert json.loads(out.read_text())["p2p"]["bandwidth_gbps"] == 0
    assert "bandwidth unlimited" in text and "0.00 GB/s" not in text


def first_iteration_only(doc, warmup):
    """The recorded run cut to its first iteration, `warmup` of them warm-up."""
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if (e.get("args") or {}).get("iteration", 0) == 0]
    doc["otherData"].update(iterations=1, warmup_iterations=warmup)
    return doc


@pytest.mark.parametrize("warmup", [0, 1], ids=["no-warmup-recorded", "cut-to-warmup"])
def test_calibrating_only_the_first_iteration_warns_it_is_warm_up(warmup, tmp_path, capsys):
    """`ppsim run --iterations 1` records no warm-up, and a trace cut to iteration 0 holds
    only warm-up: either way the fit is the run's first iteration, allocator growth and
    first kernels included, and calibrate says so rather than calling it steady."""
    case = TRACES / "1f1b-5-3-m8"
    doc = first_iteration_only(json.loads((case / "real.json").read_text()), warmup)
    cut = tmp_path / "first.json"
    cut.write_text(json.dumps(doc))
    args = ["calibrate", str(cut), "--config", str(case / "config.toml"),
            "--out", str(tmp_path / "c.json")]
    assert main(args) == 0
    out, err = capsys.readouterr()
    text = " ".join(out.split())
    assert "warning" in err and "warm-up" in err and "read high" in err
    assert err.count("\n") == 1
    assert "steady-state" not in text and "warm-up included" in text
    assert main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["warmup_iterations_fitted"] == [0] and "warning" in err


def test_calibrating_steady_iterations_gives_no_warm_up_warning(tmp_path, capsys):
    case = TRACES / "1f1b-5-3-m8"
    assert main(["calibrate", str(case / "real.json"), "--config", str(case / "config.toml"),
                 "--out", str(tmp_path / "c.json")]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err and "steady-state mean" in " ".join(out.split())


def test_calibrating_a_tensor_parallel_run_at_another_tp_is_refused(tmp_path, capsys):
    """A run's replica at tp 2 holds twice the GPUs of pp: fitting its ops' times to the
    tp 1 costs would fold the split into the factors, so calibrate names --tp."""
    case = TRACES / "1f1b-5-3-m8"
    doc = json.loads((case / "real.json").read_text())
    doc["otherData"]["job"]["gpus"] *= 2  # what the run records at tp 2 (pp 2, dp 1)
    real = tmp_path / "tp2.json"
    real.write_text(json.dumps(doc))
    argv = ["calibrate", str(real), "--config", str(case / "config.toml"), "--out"]
    assert main([*argv, str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppsim calibrate: error: --tp: ") and "recorded at tp 2" in err
    assert err.count("\n") == 1 and not (tmp_path / "c.json").exists()
