"""Where an unproven chunked plan's gap to its lower bound lies: DeepSeek-V3 pp 16
vpp 2 (interleaved 1F1B, 64 microbatches, H100 80 GB, full recompute so a split fits),
`plan` within a 10 s budget; the gap and its three parts (ppsim.plan.gap) as shares of
the best split's time.

Run:    .venv/bin/python benchmarks/bench_chunked_gap.py [--budget 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--preset", "deepseek-v3", "--hardware", "h100-80gb", "--pp", "16", "--vpp", "2",
         "--schedule", "interleaved-1f1b", "--microbatches", "64", "--recompute", "full"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=10.0)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", "plan", *FLAGS, "--time-budget",
                          str(args.budget), "--json"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 3):
        raise SystemExit(out.stderr)
    res = json.loads(out.stdout)
    t = res["best"]["iteration_time_ms"]
    print(f"load average {os.getloadavg()[0]:.0f}; {wall:.2f} s wall (budget {args.budget:g} s)")
    print(f"best {t:.1f} ms, lower bound {res['lower_bound_ms']:.1f} ms, gap "
          f"{res['best']['gap_to_lower_bound']:.2%}, proven {res['proven_optimal']}")
    g = res.get("bound_gap")
    if g:
        print(f"  bound below the mean rank's compute {g['bound_below_mean_ms'] / t:+.2%}; "
              f"busiest rank {g['rank']} above the mean {g['imbalance_ms'] / t:.2%}; "
              f"its idle time {g['idle_ms'] / t:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
