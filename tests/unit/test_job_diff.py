"""`ppsim diff` prints the throughput of both sides from the job a trace records."""

from __future__ import annotations

import json

import pytest

from ppsim.cli.main import main


def _trace(tmp_path, capsys) -> tuple:
    path = tmp_path / "sim.json"
    assert main(["simulate", "--preset", "llama3-8b", "--num-layers", "4", "--hardware",
                 "h100-80gb", "--pp", "2", "--dp", "4", "--global-batch-size", "16",
                 "--trace", str(path), "--json"]) == 0
    return path, json.loads(capsys.readouterr().out)


def test_diff_reports_the_recorded_jobs_throughput(tmp_path, capsys) -> None:
    path, sim = _trace(tmp_path, capsys)
    assert main(["diff", str(path), str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    a, b = d["throughput"]
    assert a == b
    assert a["tokens_per_s"] == pytest.approx(16 * 8192 / (d["iteration_time_ms"][0] / 1e3))
    assert a["tflops_per_gpu"] == pytest.approx(sim["throughput"]["tflops_per_gpu"], rel=1e-6)
    assert main(["diff", str(path), str(path)]) == 0
    assert "TFLOP/s/GPU" in capsys.readouterr().out


def test_a_bad_job_record_is_refused(tmp_path, capsys) -> None:
    path, _ = _trace(tmp_path, capsys)
    doc = json.loads(path.read_text())
    doc["otherData"]["job"]["gpus"] = -3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["diff", str(bad), str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "otherData.job.gpus" in err
