"""How close is a profiled data-parallel run's prediction? Profile, simulate, run, diff.

The tiny GPT on 1F1B, pp 2, split 5,3, 4 microbatches, with dp 2 replicas: DDP,
Megatron's distributed optimizer and torchtitan's FSDP (its pipelined form).
`ppsim profile --dp 2` times the ops in pp processes, records the cores the run's
pp x dp processes will share (the simulator pools them) and times the data-parallel
collectives for real; `ppsim simulate --costs` prices the step's reduce by them. Each
trial profiles, simulates, runs and diffs; the median trial is reported with every
trial's figures, since this VM's speed swings between minutes.

Run:    .venv/bin/python benchmarks/bench_dp_profile.py [--trials 3] [--iterations 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CASE = ["--preset", "tiny-gpt", "--schedule", "1f1b", "--pp", "2", "--split", "5,3",
        "--microbatches", "4", "--dp", "2"]
WAYS = {"ddp": [], "distributed optimizer": ["--use-distributed-optimizer"],
        "fsdp": ["--fsdp"]}


def ppsim(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", *args], capture_output=True,
                         text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"ppsim {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def trial(flags: list[str], tmp: str, iterations: int) -> dict[str, float]:
    costs, sim, real = (os.path.join(tmp, n) for n in ("costs.json", "sim.json", "run"))
    ppsim("profile", *flags, "--out", costs)
    ppsim("simulate", *flags, "--costs", costs, "--trace", sim)
    ppsim("run", *flags, "--iterations", str(iterations), "--trace-dir", real, "--json")
    d = json.loads(ppsim("diff", sim, os.path.join(real, "trace.json"), "--json"))
    (pred, meas), (r_pred, r_meas) = d["iteration_time_ms"], d["step_ops_ms"]["R"]
    wait = d["step_wait_ms"]["R"][1]
    # Without the step's reduce: the run's R also waits for the other replica's ranks.
    rest = ((meas - r_meas) - (pred - r_pred)) / (pred - r_pred)
    own = r_meas - wait  # the collectives alone, less the wait for the last replica
    return {"predicted_ms": pred, "measured_ms": meas, "error": d["iteration_time_error"],
            "reduce_predicted_ms": r_pred, "reduce_measured_ms": r_meas,
            "reduce_wait_ms": wait,
            "reduce_error": (r_pred - r_meas) / r_meas if r_meas else 0.0,
            "reduce_error_without_wait": (r_pred - own) / own if own > 0 else 0.0,
            "error_without_reduce": rest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=6)
    args = ap.parse_args()
    print("case                   trial  predicted ms  measured ms   error   reduce "
          "pred / meas ms (waiting)  error  less the wait   error without R")
    for name, extra in WAYS.items():
        rows = []
        for t in range(args.trials):
            with tempfile.TemporaryDirectory(prefix="ppsim-bench-dp-") as tmp:
                r = trial([*CASE, *extra], tmp, args.iterations)
            rows.append(r)
            print(f"{name:<22} {t:>5}  {r['predicted_ms']:>12.1f}  {r['measured_ms']:>11.1f}"
                  f"  {r['error']:>+6.1%}   {r['reduce_predicted_ms']:>7.2f} / "
                  f"{r['reduce_measured_ms']:>6.2f} ({r['reduce_wait_ms']:>5.2f})"
                  f"  {r['reduce_error']:>+6.1%}  {r['reduce_error_without_wait']:>+13.1%}"
                  f"   {r['error_without_reduce']:>+6.1%}", flush=True)
        median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{name:<22} median iteration error {median['error']:+.1%}, reduce error "
              f"{median['reduce_error']:+.1%} (less the wait for the last replica "
              f"{median['reduce_error_without_wait']:+.1%}), iteration error without the "
              f"reduce {median['error_without_reduce']:+.1%}")


if __name__ == "__main__":
    main()
