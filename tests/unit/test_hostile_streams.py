"""Issue 27, defect 6: a standard output that is full, closed or narrow ends in one line
on stderr and exit 2, never a traceback; `…` is written as `...` where it cannot be."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PPSIM = [sys.executable, "-P", "-m", "ppsim.cli"]


def _ppsim(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PPSIM, *args], capture_output=kw.pop("capture", True), text=True,
                          timeout=60, **kw)  # type: ignore[call-overload]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["simulate", "--json"], ["schedule"], ["--help"],
                                  ["plan", "--json", "--time-budget", "1"]])
def test_full_stdout_is_one_line_and_exit_2(args: list[str]) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*PPSIM, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "No space left" in proc.stderr


def test_closed_stdout_is_one_line_and_exit_2() -> None:
    # close_fds alone keeps 0-2; start the child with fd 1 closed, as `>&-` does.
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *PPSIM, "simulate", "--json"],
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "standard output is closed" in proc.stderr


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_narrow_encoding_prints_ascii_lookalikes(encoding: str) -> None:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": "80"}
    proc = _ppsim(["simulate"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # The rank table is cut to 80 columns: its cut headers end in an ellipsis.
    assert "..." in proc.stdout and "…" not in proc.stdout
