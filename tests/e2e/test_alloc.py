"""Freed host memory stays in the process (ppsim.executor.alloc), so an op's time does not
depend on whether its tensors' pages were handed back to the OS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Minor page faults per round of the profiler's pieces (F then B of each), after a
# warm-up: what the pieces pay to get memory back from the OS. The median round: with
# freed memory kept, a round where the heap still grows to a new high-water mark faults
# (a mean over 8 rounds once read 256 a round from one such round).
SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    from ppsim.executor.alloc import keep_freed_memory
    kept = keep_freed_memory() if sys.argv[1] == "kept" else False
    from ppsim.config.schema import load_config
    from ppsim.executor.profile import Profiler
    torch.set_num_threads(1)
    prof = Profiler(load_config(None).model.fields(), torch.device("cpu"), 8)
    def rounds(n):
        for _ in range(n):
            for p in prof.pieces:
                prof.backward(p, prof.forward(p, prof.input_for(p), 0))
    rounds(3)
    per_round = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rounds(1)
        per_round.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(kept, sorted(per_round)[len(per_round) // 2])
""")


def _faults(mode: str) -> tuple[bool, float]:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True,
                         text=True, env=env, cwd=ROOT, check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_memory_stops_the_page_faults_the_pieces_pay_by_default():
    kept, faults = _faults("kept")
    assert kept
    # A few faults remain where the heap still grows to a new high-water mark; the
    # default (glibc hands large blocks back) faults hundreds to thousands of pages every
    # round: the cost the profile and the run each paid, by chance.
    _, default = _faults("default")
    assert default > 20 * max(faults, 5.0)
