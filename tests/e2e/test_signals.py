"""Issue 27, defect 9: SIGTERM and SIGHUP of `ppsim run` clean its folder as Ctrl-C
does: ranks stopped, exit 130, no empty `ppsim-run/<time>/` with a stale lock left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signalled_run_leaves_no_run_folder(tmp_path: Path, signum: int) -> None:
    proc = subprocess.Popen([sys.executable, "-P", "-m", "ppsim.cli", "run",
                             "--iterations", "100000"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = tmp_path / "ppsim-run"
    deadline = time.monotonic() + 60
    while not list(root.glob("*/run-spec.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(root.glob("*/run-spec.json")), "the run never started"
    time.sleep(1.0)  # torchrun and its ranks are starting or running
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert os.listdir(root) == [], os.listdir(root)
