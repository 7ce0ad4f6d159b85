"""Scale: the largest simulate and plan this machine answers within 60 s and 2 GB,
and how fast the limits refuse what is too large (issue 15).

Every case is a whole `ppsim` process; wall time and that process's own peak
RSS (os.wait4) are measured. Timings on a shared machine are noisy.

Run: .venv/bin/python benchmarks/bench_scale.py [--quick]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

WALL_S, RSS_MB = 60.0, 2048.0

SIMULATE = [  # 1F1B on the default model; the ladder stops at the first one over the limits
    ("simulate", 256, 2048), ("simulate", 256, 4096), ("simulate", 256, 8192),
    ("simulate", 256, 16384), ("simulate", 256, 23000),
]
PLAN = [  # (pp, layers, microbatches, time budget)
    (64, 1024, 128, 5), (1000, 1000, 1, 10), (128, 5120, 1024, 30), (256, 10240, 2048, 55),
]
REFUSE = [
    ["simulate", "--pp", "256", "--microbatches", "65536", "--num-layers", "10000"],
    ["simulate", "--pp", "1000000000"],
    ["simulate", "--microbatches", "1000000000"],
    ["simulate", "--num-layers", "1000000000"],
    ["split", "--num-layers", "1000000000000"],
    ["plan", "--num-layers", "100000000"],
    ["plan", "--pp", "256", "--microbatches", "4096", "--num-layers", "10240", "--time-budget",
     "30"],
    ["simulate", "--pp", "64", "--microbatches", "4096", "--num-layers", "64", "--trace",
     os.devnull],
]


def run(argv: list[str]) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MB, exit status, last stderr line) of one ppsim process."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ppsim.cli", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return wall, usage.ru_maxrss / 1024, proc.returncode, last


def verdict(wall: float, rss: float, rc: int) -> str:
    return "ok" if rc == 0 and wall <= WALL_S and rss <= RSS_MB else "OVER" if rc == 0 else \
        f"exit {rc}"


def main() -> None:
    quick = "--quick" in sys.argv
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (timings scale "
          "with it)")
    print(f"{'command':60} {'ops':>11} {'wall s':>7} {'RSS MB':>7}  result")
    for cmd, pp, m in SIMULATE[:2] if quick else SIMULATE:
        argv = [cmd, "--pp", str(pp), "--microbatches", str(m), "--num-layers", str(pp),
                "--json"]
        wall, rss, rc, _ = run(argv)
        print(f"{' '.join(argv[:-1]):60} {2 * pp * m:11,} {wall:7.2f} {rss:7.0f}  "
              f"{verdict(wall, rss, rc)}", flush=True)
        if verdict(wall, rss, rc) != "ok":
            break
    for pp, layers, m, budget in PLAN[:2] if quick else PLAN:
        argv = ["plan", "--pp", str(pp), "--num-layers", str(layers), "--microbatches", str(m),
                "--time-budget", str(budget), "--json"]
        wall, rss, rc, _ = run(argv)
        print(f"{' '.join(argv[:-1]):60} {2 * pp * m:11,} {wall:7.2f} {rss:7.0f}  "
              f"{verdict(wall, rss, rc)} (budget {budget} s: {wall / budget - 1:+.0%})",
              flush=True)
    print("\nrefused up front (exit 2, one line):")
    for argv in REFUSE:
        wall, rss, rc, line = run(argv)
        print(f"  {wall:5.2f} s {rss:5.0f} MB exit {rc}: ppsim {' '.join(argv)}")
        print(f"      {line}", flush=True)


if __name__ == "__main__":
    main()
