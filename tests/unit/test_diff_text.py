"""`ppsim diff`'s text at 80 columns, and its throughput when the traces record
different jobs."""

from __future__ import annotations

import copy
import json

import pytest
from helpers import uniform_problem

from ppsim.cli.main import main
from ppsim.sim.simulate import simulate
from ppsim.trace.schema import simulation_trace

JOB = {"tokens": 1024, "flops": 6e9, "gpus": 2, "peak_tflops": 0.2}


@pytest.fixture
def sim_doc():
    problem = uniform_problem(2, 1, 4, "1f1b", counts=[3, 2], f=1.0, b=2.0, act=10, static=5)
    doc = simulation_trace(simulate(problem))
    doc["otherData"]["job"] = dict(JOB)
    return doc


def write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def slowed(doc):
    """Every B op of rank 0 half as long again: several divergences to list."""
    out = copy.deepcopy(doc)
    for e in out["traceEvents"]:
        if e.get("cat") == "compute" and e["pid"] == 0 and e["args"]["kind"] == "B":
            e["dur"] *= 1.5
    return out


def test_every_line_fits_80_columns(sim_doc, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    a, b = write(tmp_path, "a.json", sim_doc), write(tmp_path, "b.json", slowed(sim_doc))
    assert main(["diff", a, b]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    assert any(x.startswith("ops matched ") for x in lines)  # not cut off a longer line
    listed = [x for x in lines if x.startswith("  rank 0 B")]
    assert len(listed) >= 2 and all(x.endswith(" ms") for x in listed)


def test_each_trace_is_priced_by_its_own_job_and_differing_jobs_warned(sim_doc, tmp_path,
                                                                         capsys):
    other = copy.deepcopy(sim_doc)
    other["otherData"]["job"].update(gpus=4, flops=3e9)
    a, b = write(tmp_path, "a.json", sim_doc), write(tmp_path, "b.json", other)
    assert main(["diff", a, b, "--json"]) == 0
    out, err = capsys.readouterr()
    ta, tb = json.loads(out)["throughput"]
    assert tb["tokens_per_s_per_gpu"] == pytest.approx(ta["tokens_per_s_per_gpu"] / 2)
    assert tb["tflops_per_gpu"] == pytest.approx(ta["tflops_per_gpu"] / 4)  # half the FLOPs
    assert err.count("\n") == 1 and err.startswith("ppsim diff: warning: A and B record "
                                                   "different jobs")
    assert "GPUs 2 vs 4" in err and "FLOPs a token" in err
    assert main(["diff", a, a, "--json"]) == 0
    assert capsys.readouterr().err == ""  # one job: nothing to say
