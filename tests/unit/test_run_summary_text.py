"""`ppsim run`'s text summary: a --versus split and torch's engine, run in the same
launch, are printed beside the first with the measured ratio (only the first was)."""

from __future__ import annotations

import pytest

from ppsim.cli.run_summary import print_summary


def _result(engine: str, split: list[int], ms: float) -> dict:
    return {"engine": engine, "schedule": "1f1b", "pp": 2, "vpp": 1, "microbatches": 8,
            "split": split, "device": "cpu", "backend": "gloo", "wire": "cpu",
            "iterations": 4, "warmup_iterations": 1, "iteration_time_ms": ms,
            "tokens_per_s": 1e3, "losses": [9.0, 8.9], "trace": None}


@pytest.mark.parametrize("key, engine, header", [("versus", "ppsim", "the --versus split"),
                                                 ("peer", "torch", "torch's engine")])
def test_the_second_run_of_a_launch_is_printed_with_the_ratio(key, engine, header,
                                                              capsys) -> None:
    res = {**_result("ppsim", [6, 2], 100.0), key: _result(engine, [4, 4], 125.0)}
    print_summary(res)
    out = " ".join(capsys.readouterr().out.split())
    assert header in out and "split=[4, 4]" in out and "125.00 ms" in out, out
    assert f"against {engine} [4, 4] 125.00 ms: 1.250x the speed" in out, out


def test_a_single_run_prints_no_comparison(capsys) -> None:
    print_summary(_result("ppsim", [6, 2], 100.0))
    assert "against" not in capsys.readouterr().out


def test_data_parallel_replicas_and_their_reduce_are_shown(capsys) -> None:
    res = {**_result("ppsim", [6, 2], 100.0), "dp": 2, "tp": 2, "bubble_fraction": 0.25,
           "peak_memory_bytes": 2e7,
           "ranks": [{"rank": r, "layers": n, "busy_ms": 50.0, "bubble_fraction": 0.5,
                      "peak_memory_bytes": 2e7, "grad_reduce_ms": 5.25 + r}
                     for r, n in ((0, 6), (1, 2))]}
    print_summary(res)
    out = capsys.readouterr().out
    assert "vpp=1 tp=2 dp=2 microbatches=8" in out and "grad reduce ms" in out, out
    assert "5.25" in out and "6.25" in out


def test_each_line_fits_80_columns_whole(capsys, monkeypatch) -> None:
    """The header and the time line ran past 80 columns and broke mid-phrase."""
    monkeypatch.setenv("COLUMNS", "80")
    res = {**_result("ppsim", [10, 10, 10, 10, 10, 10, 10, 9], 12345.67), "tp": 8, "dp": 16,
           "pp": 8, "tokens_per_s": 1234567.0, "microbatches": 128}
    print_summary(res)
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80, lines
    assert "device=cpu (gloo, transfers via cpu)" in lines
    assert "loss 9.0000 -> 8.9000" in lines
