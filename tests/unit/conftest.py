"""Fixtures the unit tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppsim.cli.main import main


@pytest.fixture
def sim_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A simulated trace of the embedded default, written in the test's folder."""
    path = str(tmp_path / "sim.json")
    assert main(["simulate", "--trace", path]) == 0
    capsys.readouterr()
    return path
