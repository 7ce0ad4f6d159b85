"""The held-out benchmarks' published-run tables run on the current model (their --quick
parts, well under a second each): a refusal added to the model must not leave a
benchmark that crashes on a row (bench_job.py's tp-1 row once asked for
--tp-comm-overlap, which Megatron, and then ppsim, refuse there)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
ROW = re.compile(r"[+-]\d+\.\d%")


@pytest.mark.parametrize(("script", "args", "rows"), [
    ("bench_job.py", ["--quick"], 11),
    ("bench_job.py", ["--quick", "--measured", str(BENCH / "measured" / "h200-2026-12-04")], 22),
    ("bench_bridge.py", ["--quick"], 21),
    ("bench_ep_overlap.py", ["--quick"], 4),
    ("bench_torchtitan.py", [], 4),
    ("bench_release_memory.py", [], 20),
])
def test_each_published_run_is_priced(script: str, args: list[str], rows: int) -> None:
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                         text=True, cwd=BENCH, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(ROW.findall(out.stdout)) >= rows, out.stdout


def test_the_moe_block_check_runs_its_ops_on_cpu() -> None:
    """bench_moe_layer.py (a GPU check) times every op ppsim prices in a MoE block; its
    --quick CPU run checks the script, not a GPU."""
    out = subprocess.run([sys.executable, str(BENCH / "bench_moe_layer.py"), "--device", "cpu",
                          "--quick"], capture_output=True, text=True, cwd=BENCH,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    for op in ("router", "router.softmax_topk", "dispatch", "experts.fc1", "experts.act",
               "experts.fc2", "combine", "as one graph"):
        assert op in out.stdout, out.stdout
