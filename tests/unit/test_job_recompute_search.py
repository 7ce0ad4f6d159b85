"""The job search's recompute axis: the fastest global mode that fits each shape."""

from __future__ import annotations

import json

import pytest
from helpers import run_main

JOB = ["--preset", "llama3-70b", "--hardware", "h100-80gb", "--gpus", "64",
       "--global-batch-size", "256", "--seq-length", "8192", "--use-megatron-fsdp",
       "--tp", "2", "--cp", "2", "--pp", "1", "--micro-batch-size", "1"]
"""A shape that fits 80 GB with no recompute at all (FlashAttention keeps no score
matrix, so the preset's selective recompute of core attention saves next to nothing)."""


def _time(mode: str) -> dict:
    code, out, err = run_main(["simulate", *JOB, "--recompute", mode, "--json"])
    assert code == 0, err
    return json.loads(out)


def test_the_recompute_search_starts_from_none() -> None:
    """Recompute only adds time, so the first mode from none that fits is the fastest. The
    search started from the configured mode (the preset's selective) and never tried none,
    while `--search policy` found it."""
    code, out, err = run_main(["plan", *JOB, "--search", "recompute", "--top", "1",
                               "--json"])
    assert code == 0, err
    best = json.loads(out)["best"]
    none, selective = _time("none"), _time("selective")
    assert none["fits"] and selective["fits"]
    assert none["iteration_time_ms"] < selective["iteration_time_ms"]
    assert best["memory_policy"] == "none" and best["megatron_policy_flags"] == ""
    assert best["iteration_time_ms"] == pytest.approx(none["iteration_time_ms"], rel=1e-12)
    code, out, _ = run_main(["plan", *JOB, "--search", "policy", "--top", "1", "--json"])
    assert json.loads(out)["best"]["iteration_time_ms"] <= best["iteration_time_ms"] + 1e-9
