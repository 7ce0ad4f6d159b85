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
    ("bench_bridge.py", ["--quick"], 8),
    ("bench_ep_overlap.py", ["--quick"], 4),
    ("bench_torchtitan.py", [], 4),
])
def test_each_published_run_is_priced(script: str, args: list[str], rows: int) -> None:
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                         text=True, cwd=BENCH, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(ROW.findall(out.stdout)) >= rows, out.stdout
