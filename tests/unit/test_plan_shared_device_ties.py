"""Ranks sharing a device: the planner's candidates are re-timed with the shared
simulator and ordered by the planner's own rule (ppsim.plan.ranking), so a split that
ties another to float rounding loses to the one of lower peak memory, as it does on
unshared devices."""

from __future__ import annotations

import json

from helpers import run_cli

SHARED = ["--preset", "tiny-gpt", "--pp", "3", "--num-layers", "8", "--microbatches", "2",
          "--schedule", "gpipe", "--devices", "0,0,0"]


def _simulated(split: str) -> dict:
    ran = run_cli(["simulate", *SHARED, "--split", split, "--json"])
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_a_rounding_tie_on_one_device_goes_to_the_lower_peak() -> None:
    a, b = _simulated("2,4,2"), _simulated("4,3,1")
    # The two time the same but for the last bits; 2,4,2 keeps less in memory.
    assert abs(a["iteration_time_ms"] - b["iteration_time_ms"]) < 1e-9 * a["iteration_time_ms"]
    peak = {name: max(r["peak_memory_bytes"] for r in d["ranks"])
            for name, d in (("2,4,2", a), ("4,3,1", b))}
    assert peak["2,4,2"] < peak["4,3,1"]
    ran = run_cli(["plan", *SHARED, "--json"])
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["best"]["split"] == [2, 4, 2]
