"""`ppsim demo` on the embedded default, several times: each run's planned split,
predicted and measured speed-up over the even split, and wall time.

Run: .venv/bin/python benchmarks/bench_demo.py [RUNS] (default 3; each ~2 minutes
on a 2-core machine). Every run profiles afresh, so each line is a whole demo.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

SPEEDUP = re.compile(r"predicted ([0-9.]+)x, measured\s+([0-9.]+)x")
PLANNED = re.compile(r"planned split (\[[0-9, ]+\])")


def one_run(out: str) -> dict[str, str | float]:
    """One `ppsim demo --out OUT`: its plan, speed-ups and wall seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "ppsim.cli", "demo", "--out", out],
                         capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"ppsim demo failed:\n{res.stdout}\n{res.stderr}")
    text = " ".join(res.stdout.split())  # rich wraps long lines
    speed, split = SPEEDUP.search(text), PLANNED.search(text)
    if speed is None or split is None:
        raise SystemExit(f"no speed-up line in ppsim demo's output:\n{res.stdout}")
    return {"split": split.group(1), "predicted": float(speed.group(1)),
            "measured": float(speed.group(2)), "seconds": seconds}


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"{'run':>3} {'planned':>8} {'predicted':>9} {'measured':>8} {'seconds':>7}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            r = one_run(os.path.join(tmp, f"demo-{i + 1}"))
            print(f"{i + 1:>3} {r['split']:>8} {r['predicted']:>8.3f}x {r['measured']:>7.3f}x "
                  f"{r['seconds']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
