"""How close is a run predicted from a profile measured in tensor-, expert- or
context-parallel processes? Profile, simulate, run, diff.

A MoE tiny GPT (MoE every other layer, 4 experts, top-2) on 1F1B, pp 2, 4 microbatches:
`ep = 2` over dp 2, the same model at tp 2 (its experts split over the tensor ranks), and
at cp 2 with K and V passed round the ring (Megatron's default) and gathered.
`ppsim profile` times each piece in the ranks one tensor, expert or context-parallel
group spans (2 processes here), its collectives inside; the run has pp x dp x tp x cp =
4 processes on this host, which the profile does not time beside each other. Each trial
profiles, simulates, runs and diffs; the median trial is reported with every trial's
error, and the error of the collectives' waits inside its ops (priced from the
profile's bare collectives, against the run's).

Run:    .venv/bin/python benchmarks/bench_parallel_profile.py [--trials 3] [--only 'cp 2']
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "e2e")]
from bench_dp_profile import ppsim  # noqa: E402  (the CLI in a process, one thread)
from launch_cases import MOE_TOML  # noqa: E402  (the tests' MoE, as `simulate` and `run` read it)

PIPELINE = ["--schedule", "1f1b", "--pp", "2", "--microbatches", "4"]
CASES = {"ep 2 over dp 2": ("ep = 2\n", ["--dp", "2"]),
         "tp 2 (experts split over it)": ("", ["--tp", "2"]),
         "cp 2 (K and V round the ring)": ("cp = 2\n", []),
         "cp 2 (K and V gathered)": ('cp = 2\ncp_comm_type = "all_gather"\n', [])}


def trial(extra: str, flags: list[str], tmp: str) -> dict[str, float]:
    cfg = os.path.join(tmp, "moe.toml")
    Path(cfg).write_text(MOE_TOML + extra)
    costs, sim, real = (os.path.join(tmp, n) for n in ("costs.json", "sim.json", "run"))
    job = ["--config", cfg, *flags, *PIPELINE]
    ppsim("profile", *job, "--out", costs)
    ppsim("simulate", *job, "--costs", costs, "--trace", sim)
    ppsim("run", *job, "--iterations", "6", "--trace-dir", real, "--json")
    d = json.loads(ppsim("diff", sim, os.path.join(real, "trace.json"), "--json"))
    predicted, measured = d["iteration_time_ms"]
    # each group's collectives inside the ops: the median op's wait, priced / measured
    waits = {f"{r['group']} {r['op']}": r["ms"][0] / r["ms"][1] - 1 for r in d["collectives"]}
    return {"predicted_ms": predicted, "measured_ms": measured,
            "error": (predicted - measured) / measured, "waits": waits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--only", metavar="WORDS", default="",
                    help="the cases whose name holds WORDS (e.g. 'cp 2')")
    args = ap.parse_args()
    for name, (extra, flags) in CASES.items():
        if args.only not in name:
            continue
        runs = []
        for i in range(args.trials):
            with tempfile.TemporaryDirectory(prefix="ppsim-bench-") as tmp:
                runs.append(trial(extra, flags, tmp))
            print(f"  {name} trial {i + 1}: predicted {runs[-1]['predicted_ms']:.1f} ms, "
                  f"measured {runs[-1]['measured_ms']:.1f} ms ({runs[-1]['error']:+.1%})",
                  file=sys.stderr)
        mid = sorted(runs, key=lambda r: r["error"])[len(runs) // 2]
        trials = ", ".join(format(r["error"], "+.1%") for r in runs)
        print(f"{name}: predicted {mid['predicted_ms']:.1f} ms, measured "
              f"{mid['measured_ms']:.1f} ms, error {mid['error']:+.1%} (median of "
              f"{len(runs)}; trials {trials}; "
              f"spread {statistics.pstdev(r['error'] for r in runs):.1%}); collectives' "
              "median wait priced against measured: " + ", ".join(
                  f"{k} {v:+.0%}" for k, v in mid["waits"].items()))


if __name__ == "__main__":
    main()
