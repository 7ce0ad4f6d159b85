"""Two memory policies run for real on one GPU against their simulation.

A gpt3-1.3b-shaped GPT of 8 layers, pp 2 on one device (`--devices 0,0`), 1F1B, 8
microbatches: no policy, then core_attn recomputed, the first 2 layers of each stage
recomputed whole and attn_norm, qkv_linear, mlp_norm offloaded (to pinned host
memory). For each: the measured activation peak per rank (the run's trace, sampled
between ops) and its iteration time against `ppsim simulate` on the h200-141gb preset
(its peak of what the ops hold between them).

Run:    python3 benchmarks/bench_memory_policy_gpu.py --device cuda
        (benchmarks/gpu_checks.sh policy)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["--num-layers", "8", "--pp", "2", "--split", "4,4", "--schedule", "1f1b",
        "--microbatches", "8", "--recompute", "none"]
POLICIES = {"none": [],
            "policy": ["--recompute-modules", "core_attn", "--recompute-num-layers", "2",
                       "--fine-grained-activation-offloading", "--offload-modules",
                       "attn_norm,qkv_linear,mlp_norm"],
            # The policy's parts alone (--policies), to tell which one a GPU peak misses.
            "core_attn": ["--recompute-modules", "core_attn"],
            "block": ["--recompute-num-layers", "2"],
            "offload": ["--fine-grained-activation-offloading", "--offload-modules",
                        "attn_norm,qkv_linear,mlp_norm"]}


def _ppsim(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=500, check=False)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout)


def _between_ops_peaks(argv: list[str]) -> list[int]:
    """simulate's activation peaks of what the ops hold between them, which is what the
    run's trace samples (ppsim.sim.simulate.between_ops_peaks)."""
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.pipeline.problem import build_problem
    from ppsim.sim.simulate import between_ops_peaks

    return between_ops_peaks(build_problem(config_from_args(
        build_parser().parse_args(["simulate", *argv]))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--preset", default="gpt3-1.3b", help="tiny-gpt: the script's path on CPU")
    ap.add_argument("--policies", default="none,policy",
                    help=f"comma-separated, of {', '.join(POLICIES)}")
    ap.add_argument("--trace-out", type=Path, help="keep each run's trace as DIR/<policy>.json")
    args = ap.parse_args()
    base = ["--preset", args.preset, *BASE]
    print(f"{'policy':8} {'rank':>4} {'measured B':>14} {'simulated B':>14} {'ratio':>6} "
          f"{'measured ms':>12} {'simulated ms':>12}")
    for name in args.policies.split(","):
        flags = POLICIES[name]
        with tempfile.TemporaryDirectory() as tmp:
            res = _ppsim("run", *base, *flags, "--device", args.device, "--devices", "0,0",
                         "--iterations", "4", "--warmup", "2", "--trace-dir",
                         str(Path(tmp) / "out"), "--json")
            trace = Path(tmp) / "out" / "trace.json"
            events = json.loads(trace.read_text())["traceEvents"]
            if args.trace_out:
                args.trace_out.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(trace, args.trace_out / f"{name}.json")
                (args.trace_out / f"{name}-run.json").write_text(json.dumps(res, indent=1))
        sim_args = [*base, *flags, "--hardware", "h200-141gb", "--devices", "0,0"]
        sim = _ppsim("simulate", *sim_args, "--json")
        for r, want in enumerate(_between_ops_peaks(sim_args)):
            got = max(e["args"]["activations"] for e in events
                      if e.get("ph") == "C" and e["pid"] == r)
            print(f"{name:8} {r:>4} {got:>14,} {want:>14,} {got / want:>6.3f} "
                  f"{res['iteration_time_ms']:>12.1f} {sim['iteration_time_ms']:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
