"""Readers and calibrate against large inputs: seconds and peak memory (issue 27).

Each case runs in a fresh process (`ppsim ...` or a one-line reader), so its peak
RSS is its own. Cases: `ppsim calibrate` on traces of 200, 2,000 and 20,000
iterations (the embedded default's ops, repeated); reading a trace of 1M compute
events; refusing a trace and a CSV above their cost limits; reading and
validating a CSV at its cell limit; `ppsim plan` of the
405B preset over four search axes against its --time-budget.

    .venv/bin/python benchmarks/bench_hostile.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from ppsim.schedules.torchcsv import MAX_CSV_CELLS

PY = [sys.executable, "-P"]


def _timed(argv: list[str]) -> tuple[float, float, int]:
    """Seconds, peak RSS (MB) of the child, exit status."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the largest yet
    return time.perf_counter() - t0, usage.ru_maxrss / 1e3, os.waitstatus_to_exitcode(status)


def _added_mb(csv: str) -> float:
    """Peak memory a CSV read adds to its process, from the process itself: its VmHWM
    after the import and after the read (ru_maxrss would start from this parent's peak,
    VmHWM starts afresh at exec)."""
    hwm = ("lambda: int(next(line.split()[1] for line in open('/proc/self/status') "
           "if line.startswith('VmHWM')))")
    out = subprocess.run([*PY, "-c", f"from ppsim.schedules.torchcsv import "
                          f"load_actions_csv; hwm = {hwm}; base = hwm(); "
                          f"load_actions_csv({csv!r}); print(hwm() - base)"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout) / 1e3


def _write_events(path: str, events: Iterator[dict], other: dict) -> None:
    """A trace written event by event, so this process stays small: a child's peak RSS
    starts from its parent's at fork."""
    with open(path, "w") as fh:
        fh.write('{"traceEvents": [')
        for n, ev in enumerate(events):
            fh.write(("," if n else "") + json.dumps(ev))
        fh.write('], "otherData": ' + json.dumps(other) + "}")


def _repeated_trace(folder: str, iterations: int) -> str:
    sim = os.path.join(folder, "sim.json")
    subprocess.run([*PY, "-m", "ppsim.cli", "simulate", "--trace", sim], check=True,
                   capture_output=True)
    with open(sim) as fh:
        doc = json.load(fh)
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "compute"]
    length = max(e["ts"] + e["dur"] for e in ops) * 1.1
    path = os.path.join(folder, f"trace-{iterations}.json")
    _write_events(path, ({**e, "ts": e["ts"] + i * length, "args": {**e["args"],
                                                                    "iteration": i}}
                         for i in range(iterations) for e in ops),
                  {**doc["otherData"], "source": "bench"})
    return path


def _csv_at_the_cell_limit(folder: str) -> str:
    """A valid GPipe order on 4 ranks (every F, then every B) of MAX_CSV_CELLS cells."""
    path = os.path.join(folder, "at-cap.csv")
    microbatches = MAX_CSV_CELLS // 8
    with open(path, "w") as fh:
        for r in range(4):
            fh.write(",".join([f"{r}F{i}" for i in range(microbatches)]
                              + [f"{r}B{i}" for i in range(microbatches)]) + "\n")
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for n in (200, 2_000, 20_000):
            path = _repeated_trace(folder, n)
            s, mb, code = _timed([*PY, "-m", "ppsim.cli", "calibrate", path, "--out",
                                  os.path.join(folder, f"cal-{n}.json"), "--json"])
            print(f"calibrate, {n:,} iterations ({os.path.getsize(path) / 1e6:.0f} MB): "
                  f"{s:.2f} s, {mb:.0f} MB, exit {code}")
        big = os.path.join(folder, "events.json")
        _write_events(big, ({"name": "F0", "cat": "compute", "ph": "X", "pid": i % 8,
                             "tid": 0, "ts": float(i), "dur": 1.0,
                             "args": {"kind": "F", "stage": i % 8, "chunk": 0,
                                      "microbatch": i // 8}} for i in range(1_000_000)), {})
        s, mb, code = _timed([*PY, "-c", "from ppsim.trace.read import read_trace; "
                              f"read_trace({big!r})"])
        print(f"read a trace of 1M compute events ({os.path.getsize(big) / 1e6:.0f} MB): "
              f"{s:.2f} s, {mb:.0f} MB, exit {code}")
        empty = os.path.join(folder, "empty.json")
        with open(empty, "w") as fh:
            fh.write('{"traceEvents": [')
            fh.writelines("{}," for _ in range(40_000_000 - 1))
            fh.write("{}]}")
        s, mb, code = _timed([*PY, "-m", "ppsim.cli", "diff", empty, empty])
        print(f"refuse 40M empty events (120 MB): {s:.2f} s, {mb:.0f} MB, exit {code}")
        csv = os.path.join(folder, "cells.csv")
        with open(csv, "w") as fh:
            fh.writelines("0F0," for _ in range(16_000_000 - 1))
            fh.write("0F0\n")
        s, mb, code = _timed([*PY, "-m", "ppsim.cli", "simulate", "--actions-csv", csv])
        print(f"refuse a CSV of 16M cells (64 MB): {s:.2f} s, {mb:.0f} MB, exit {code}")
        at_cap = _csv_at_the_cell_limit(folder)
        s, mb, code = _timed([*PY, "-c", "from ppsim.schedules.torchcsv import "
                              f"load_actions_csv; load_actions_csv({at_cap!r})"])
        size = os.path.getsize(at_cap) / 1e6
        print(f"read and validate a CSV at the cell limit ({MAX_CSV_CELLS:,} cells, "
              f"{size:.1f} MB): {s:.2f} s, {mb:.0f} MB, exit {code}; the read itself adds "
              f"{_added_mb(at_cap):.1f} MB: {_added_mb(at_cap) / size:.2f}x the file")
    for budget in (2, 25):
        t0 = time.perf_counter()
        proc = subprocess.run([*PY, "-m", "ppsim.cli", "plan", "--preset", "llama3.1-405b",
                               "--search", "schedule,vpp,microbatches,recompute",
                               "--time-budget", str(budget), "--json"],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        said = json.loads(proc.stdout)["seconds"] if proc.returncode in (0, 3) else None
        print(f"plan 405B, 4 axes, --time-budget {budget}: {wall:.2f} s wall, JSON seconds "
              f"{said if said is None else round(said, 2)}, exit {proc.returncode}")


if __name__ == "__main__":
    main()
