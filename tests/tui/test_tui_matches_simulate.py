"""The numbers the TUI shows for a file are the numbers `ppsim simulate --json` prints
for it: an independent check (a separate process, the command line's own path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import simulate_json

from ppsim.config.schema import DEFAULT_TOML, load_config
from ppsim.tui.headline import headline_text
from ppsim.tui.session import evaluate_state, state_from_config

CONFIGS = {
    "placement shared": DEFAULT_TOML + "\n[placement]\ndevices = [0, 0]\n",
    "placement nodes": """\
[model]
kind = "uniform"
num_layers = 12
forward_ms = 1.5
backward_ms = 3.0
activation_bytes = 1000000
output_bytes = 4000000
static_bytes = 1000

[pipeline]
pp = 4
microbatches = 6
split = [4, 3, 3, 2]

[hardware]
p2p_bandwidth_gbps = 2.0
p2p_latency_ms = 0.1

[placement]
ranks_per_node = 2
inter_node_bandwidth_gbps = 0.5
context_switch_ms = 0.05
""",
    "preset interleaved": """\
[model]
preset = "llama3-8b"

[pipeline]
pp = 4
vpp = 2
microbatches = 8
schedule = "interleaved-1f1b"

[hardware]
preset = "h100-80gb"
""",
    "preset zbv": """\
[model]
preset = "gpt3-1.3b"
recompute = "selective"

[pipeline]
pp = 2
vpp = 2
microbatches = 6
schedule = "zbv"

[hardware]
preset = "a100-80gb"
""",
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tui_shows_what_simulate_prints(name: str, tmp_path: Path) -> None:
    path = tmp_path / "f.toml"
    path.write_text(CONFIGS[name])
    ref = simulate_json(path)
    cfg = load_config(str(path))  # what `ppsim tui --config f.toml` loads and shows
    result = evaluate_state(cfg, state_from_config(cfg))
    s = result.sim.summary
    assert list(result.state.counts) == ref["split"]
    assert (result.state.schedule, result.state.pp, result.state.vpp) == \
        (ref["schedule"], ref["pp"], ref["vpp"])
    assert s.iteration_time_ms == ref["iteration_time_ms"]
    assert s.bubble_fraction == ref["bubble_fraction"]
    assert [r.peak_memory_bytes for r in s.ranks] == \
        [r["peak_memory_bytes"] for r in ref["ranks"]]
    shown = headline_text(result).plain
    assert f"iteration {ref['iteration_time_ms']:.3f} ms" in shown
    assert f"bubble {ref['bubble_fraction']:.1%}" in shown
