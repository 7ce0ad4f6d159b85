"""Every benchmark script loads: its imports name what the package still has (a module
that moved leaves a benchmark, and the GPU checks that run it, broken)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_the_benchmark_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "torch" in path.read_text(encoding="utf-8"):
        pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/X.py` has it
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, module)  # dataclasses look their module up
    spec.loader.exec_module(module)  # module level only: the work runs under __main__
