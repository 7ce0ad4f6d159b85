"""Recompute and data parallelism on the executor: measured against predicted.

For both shipped builders (the GPT, and the Llama-style dense + MoE stack of
tests/model_moe.py) and recompute none / selective / full: the measured peak
activation bytes per rank (`ppsim run`'s trace) against `ppsim simulate`'s (what
autograd saves, which is what the executor counts on CPU),
and the measured iteration time (recompute buys memory with time). Then dp 1
against dp 2 (4 gloo ranks): iteration time and the gradient all-reduce (R).
Timings on a shared CPU are noisy; bytes are exact.

Run:    .venv/bin/python benchmarks/bench_recompute.py [--microbatches 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDERS = {"gpt": [], "llama-moe": ["--model", "tests/model_moe.py:build"]}


def _ppsim(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _measured(base: list[str], extra: list[str]) -> tuple[dict, list[int]]:
    with tempfile.TemporaryDirectory() as d:
        res = _ppsim("run", *base, *extra, "--iterations", "3", "--warmup", "1",
                     "--trace-dir", d, "--json")
        with open(os.path.join(d, "trace.json"), encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
    peaks = [max((e["args"]["activations"] for e in events
                  if e.get("ph") == "C" and e["pid"] == r), default=0) for r in range(res["pp"])]
    return res, peaks


def _saved_peaks(base: list[str], mode: str) -> list[int]:
    """`ppsim simulate`'s activation peaks of what the ops hold between them: the executor
    on CPU counts saved tensors (ppsim.sim.simulate.between_ops_peaks)."""
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.pipeline.problem import build_problem
    from ppsim.sim.simulate import between_ops_peaks

    cfg = config_from_args(build_parser().parse_args(["simulate", *base, "--recompute", mode]))
    return between_ops_peaks(build_problem(cfg))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, default=4)
    args = ap.parse_args()
    base = ["--schedule", "1f1b", "--pp", "2", "--split", "5,3", "--microbatches",
            str(args.microbatches)]
    print(f"{'builder':10} {'recompute':10} {'rank':>4} {'measured B':>12} {'predicted B':>12} "
          f"{'ratio':>6} {'iter ms':>8}")
    for name, model in BUILDERS.items():
        for mode in ("none", "selective", "full"):
            res, peaks = _measured(base, [*model, "--recompute", mode])
            for r, pred in enumerate(_saved_peaks(base, mode)):
                print(f"{name:10} {mode:10} {r:>4} {peaks[r]:>12,} {pred:>12,} "
                      f"{peaks[r] / pred:>6.2f} {res['iteration_time_ms']:>8.1f}")
    print()
    for name, model in BUILDERS.items():
        for dp in (1, 2):
            res, _ = _measured(base, [*model, "--dp", str(dp)])
            reduce_ms = max(r["grad_reduce_ms"] for r in res["ranks"])
            print(f"{name:10} dp {dp}: iteration {res['iteration_time_ms']:8.1f} ms, "
                  f"all-reduce {reduce_ms:6.2f} ms, tokens/s {res['tokens_per_s']:9,.0f}, "
                  f"loss {res['losses'][0]:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
