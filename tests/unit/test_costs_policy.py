"""`ppsim costs` under a memory policy prices the layers as simulate does."""

from __future__ import annotations

import json

from tests.helpers import run_main

SHAPE = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
         "--microbatches", "8"]
MLP = ["--recompute-granularity", "selective", "--recompute-modules", "mlp"]


def _simulated(argv: list[str]) -> tuple[float, list[int]]:
    code, out, _ = run_main(["simulate", *argv, "--json"])
    assert code == 0
    d = json.loads(out)
    return d["iteration_time_ms"], [r["peak_memory_bytes"] for r in d["ranks"]]


def test_a_module_policys_cost_file_simulates_as_the_policy(tmp_path) -> None:
    """The cost file `costs --json` writes under --recompute-modules mlp simulates to the
    policy's own iteration and peaks (it priced the layers without the policy), and each
    layer keeps fc1's output and the SwiGLU's fewer: 8192 tokens x 14336 x (2 + 1) x 2
    bytes."""
    code, out, _ = run_main(["costs", *SHAPE, *MLP, "--json"])
    assert code == 0
    path = tmp_path / "mlp.json"
    path.write_text(out)
    code, plain, _ = run_main(["costs", *SHAPE, "--recompute", "none", "--json"])
    kept = json.loads(out)["layers"][0]["activation_bytes"]
    assert json.loads(plain)["layers"][0]["activation_bytes"] - kept == 8192 * 14336 * 3 * 2
    assert _simulated([*SHAPE, "--recompute", "none", "--costs", str(path)]) == \
        _simulated([*SHAPE, *MLP])


def test_a_block_n_says_the_table_is_not_every_stage(tmp_path) -> None:
    code, _, err = run_main(["costs", *SHAPE, "--recompute-granularity", "full",
                             "--recompute-method", "block", "--recompute-num-layers", "2"])
    assert code == 0
    assert "block N" in err and "simulate prices each stage" in err
