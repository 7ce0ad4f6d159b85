"""`ppsim plan --gpus N --global-batch-size B`: shapes Megatron accepts, fastest first."""

from __future__ import annotations

import json

import pytest

from ppsim.cli.main import main

ARGS = ["--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb",
        "--gpus", "16", "--global-batch-size", "32", "--time-budget", "30"]


@pytest.fixture(scope="module")
def planned() -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", *ARGS, "--top", "400", "--json"]) == 0
    return json.loads(out.getvalue())


def test_every_shape_is_one_megatron_accepts(planned: dict) -> None:
    cands = planned["candidates"]
    assert len(cands) == planned["evaluated"] > 20
    for c in cands:
        assert c["tp"] * c["cp"] * c["pp"] * c["dp"] == 16
        assert c["micro_batch_size"] * c["microbatches"] * c["dp"] == 32
        assert c["tp"] <= 8 and 8 % c["tp"] == 0 and 8 % c["tp"] == 0  # kv heads 8
        assert 8192 % (2 * c["cp"]) == 0
        assert sum(c["split"]) == 8


def test_fitting_shapes_come_fastest_first_with_their_throughput(planned: dict) -> None:
    fits = [c for c in planned["candidates"] if c["fits"]]
    times = [c["iteration_time_ms"] for c in fits]
    assert times == sorted(times)
    best = planned["best"]
    assert best["iteration_time_ms"] == times[0]
    t = best["throughput"]
    assert t["tokens_per_s"] == pytest.approx(32 * 8192 / (best["iteration_time_ms"] / 1e3))
    assert all(c["held_back_by"] for c in planned["candidates"])
    assert any(c["held_back_by"].startswith("bubble") for c in fits if c["pp"] > 1)


def test_best_shape_simulates_to_the_same_time(planned: dict, capsys) -> None:
    b = planned["best"]
    argv = ["simulate", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
            "h100-80gb", "--tp", str(b["tp"]), "--cp", str(b["cp"]), "--pp", str(b["pp"]),
            "--vpp", str(b["vpp"]), "--dp", str(b["dp"]), "--micro-batch-size",
            str(b["micro_batch_size"]), "--global-batch-size", "32", "--schedule",
            b["schedule"], "--split", ",".join(map(str, b["split"])), "--json"]
    assert main(argv) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_time_ms"] == pytest.approx(b["iteration_time_ms"], rel=1e-12)
    assert sim["throughput"] == pytest.approx(b["throughput"])


def test_a_batch_no_shape_divides_is_refused(capsys) -> None:
    # 48 GPUs over power-of-two tp, cp and pp leave dp a multiple of 3; 8 is not.
    rc = main(["plan", "--preset", "llama3-8b", "--gpus", "48", "--global-batch-size", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and "--global-batch-size" in err and len(err.strip().splitlines()) == 1
