"""Measurements in several processes survive a process that aborts after writing its
result (gloo's rare teardown abort), and still fail when a result is missing. Real
processes: the aborting one calls os.abort(), as std::terminate does."""

from __future__ import annotations

import faulthandler
import os
import time

import pytest

pytest.importorskip("torch")

from torch.multiprocessing import ProcessExitedException  # noqa: E402

from ppsim.executor.spawned import spawn_results
from ppsim.fileio import write_json_atomic  # noqa: E402


def _writes_then_maybe_aborts(rank: int, folder: str, abort_before: bool, n: int) -> None:
    faulthandler.disable()  # forked from pytest: its stack dump on SIGABRT is noise here
    if rank == 1 and abort_before:
        os.abort()
    write_json_atomic(os.path.join(folder, f"r{rank}.json"), {"rank": rank, "sq": rank * rank})
    if rank == 1:  # after every result, as gloo's abort comes after the last barrier
        deadline = time.monotonic() + 60
        while (len([f for f in os.listdir(folder) if f.startswith("r")]) < n
               and time.monotonic() < deadline):
            time.sleep(0.01)
        os.abort()


def test_an_abort_after_the_result_keeps_the_measurement(tmp_path, capfd):
    paths = [str(tmp_path / f"r{r}.json") for r in range(3)]
    got = spawn_results(_writes_then_maybe_aborts, (str(tmp_path), False, 3), 3, paths)
    assert got == [{"rank": r, "sq": r * r} for r in range(3)]
    assert "exited abnormally" in capfd.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["r0.json", "r1.json", "r2.json"]  # no temps


def test_an_abort_before_the_result_is_raised(tmp_path):
    paths = [str(tmp_path / f"r{r}.json") for r in range(2)]
    with pytest.raises(ProcessExitedException):
        spawn_results(_writes_then_maybe_aborts, (str(tmp_path), True, 2), 2, paths)


_AFTER_THREADS = """
import json, os, sys, torch
from ppsim.executor.spawned import spawn_results
from ppsim.fileio import write_json_atomic

def work(rank, folder):
    x = torch.rand(256, 256)
    write_json_atomic(os.path.join(folder, f"r{rank}.json"), float((x @ x).sum()))

torch.set_num_threads(2)
torch.rand(512, 512) @ torch.rand(512, 512)  # the parent's OpenMP pool, running
folder = sys.argv[1]
spawn_results(work, (folder,), 2, [os.path.join(folder, f"r{r}.json") for r in range(2)])
"""


def test_processes_forked_after_the_parent_ran_threads_finish(tmp_path) -> None:
    """A forked measuring process that enters an OpenMP parallel region its parent had
    run hangs (GNU OpenMP's pool does not survive fork); spawn_results sets each
    process's threads first, so it finishes (a test after one that trained in-process
    hung here)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", _AFTER_THREADS, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["r0.json", "r1.json"]
