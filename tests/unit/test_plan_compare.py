"""`plan --compare`: the splits asked for are rows of the answer, timed as `simulate`
times them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_main

UNIFORM = """
[model]
kind = "uniform"
num_layers = 6
forward_ms = 1.0
backward_ms = 2.0
static_bytes = 1000
activation_bytes = 100
output_bytes = 100000
[model.head]
forward_ms = 4.0
backward_ms = 8.0
[model.embedding]
forward_ms = 2.0
[pipeline]
pp = 2
microbatches = 8
schedule = "1f1b"
[hardware]
memory_bytes = 1e9
p2p_latency_ms = 0.1
p2p_bandwidth_gbps = 1.0
"""


@pytest.fixture()
def config(tmp_path: Path) -> str:
    path = tmp_path / "c.toml"
    path.write_text(UNIFORM)
    return str(path)


def test_compare_splits_stay_when_another_searched_variant_wins(config: str) -> None:
    """Under --search schedule a V schedule wins here; the --compare and launch-line rows
    (timed in the configured 1F1B shape) vanished from the table and the JSON."""
    argv = ["plan", "--config", config, "--search", "schedule", "--compare", "3,3",
            "--layout", "Et*4|t*2L", "--time-budget", "5"]
    code, out, err = run_main([*argv, "--json"])
    assert code == 0, err
    data = json.loads(out)
    assert data["variant"] != "as configured"
    rows = {tuple(c["split"]): c for c in data["compared"]}
    assert set(rows) == {(3, 3), (4, 2)}
    for counts, row in rows.items():
        code, sim_out, err = run_main(["simulate", "--config", config, "--split",
                                       ",".join(map(str, counts)), "--json"])
        sim = json.loads(sim_out)
        assert row["iteration_time_ms"] == sim["iteration_time_ms"]
        assert row["best_speedup"] == pytest.approx(
            sim["iteration_time_ms"] / data["best"]["iteration_time_ms"])
        assert "as configured" in row["label"]
    code, text, err = run_main(argv)
    assert code == 0, err
    lines = text.splitlines()
    assert any(x.startswith("3,3 (as configured)") for x in lines), text
    assert any(x.startswith("vs 3,3 (as configured): best is ") for x in lines), text
