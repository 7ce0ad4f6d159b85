"""The memory policy planned with the split: best global mode, best Megatron-expressible
policy, best per-stage policy, on four flagship configurations.

For each case, `ppsim plan --search policy,policy-per-stage --time-budget 10 --json`
(H100 80 GB), its wall time, and each space's best iteration time, gain over the best
global mode and policy. Llama 3.1 405B pp 16 is the case of issue 28: the best single
global mode needs 38.1 s (no recompute, layers moved off the early ranks), the Llama 3
paper's split 7, 8 x 14, 7 would take 34.6 s but does not fit 80 GB.

Run:    .venv/bin/python benchmarks/bench_memory_policy.py [--budget 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [
    ("Llama 3.1 405B, pp 16, 128 mb", ["--preset", "llama3.1-405b", "--pp", "16",
                                        "--microbatches", "128"]),
    ("GPT-3 175B, pp 8, 64 mb", ["--preset", "gpt3-175b", "--pp", "8", "--microbatches", "64"]),
    ("DeepSeek-V3, pp 16 vpp 2, 64 mb", ["--preset", "deepseek-v3", "--pp", "16", "--vpp", "2",
                                          "--schedule", "interleaved-1f1b",
                                          "--microbatches", "64"]),
    ("Llama 3 70B, tp 4, pp 8, 64 mb", ["--preset", "llama3-70b", "--tp", "4", "--pp", "8",
                                         "--microbatches", "64"]),
]


def run(flags: list[str], budget: float) -> tuple[dict, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", "plan", *flags, "--hardware",
                          "h100-80gb", "--search", "policy,policy-per-stage", "--time-budget",
                          str(budget), "--json"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 3):
        raise SystemExit(out.stderr)
    return json.loads(out.stdout), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=10.0)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.0f}")
    for name, flags in CASES:
        res, wall = run(flags, args.budget)
        print(f"\n{name}: {wall:.2f} s wall (budget {args.budget:g} s)")
        for sp in res["policy_search"]:
            b = sp["best"]
            if b is None:
                print(f"  {sp['space']:9} {sp['label'] or 'no fit'}")
                continue
            per = sorted({(p["recompute_modules"] and ",".join(p["recompute_modules"]) or "-")
                          + (f" N={p['recompute_layers']}" if p["recompute_layers"] else "")
                          + (f" offload {p['offload_fraction']:.2f} "
                             f"{','.join(p['offload_modules'])}" if p["offload_modules"] else "")
                          for p in b["policy"]})
            print(f"  {sp['space']:9} {b['iteration_time_ms']:10.1f} ms  gain "
                  f"{sp.get('gain_vs_global', 1.0):.3f}  proven {sp['proven_optimal']!s:5}  "
                  f"split {b['split']}  memory rank {sp['memory_rank']}  "
                  f"busiest {sp['busiest_rank']}")
            print(f"            policies: {'; '.join(per)}")
            if sp.get("megatron_policy_flags"):
                print(f"            Megatron: {sp['megatron_policy_flags']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
