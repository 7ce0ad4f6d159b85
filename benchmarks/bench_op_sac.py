"""torchtitan's activation checkpointing on its own config-registry functions: no
checkpointing, SelectiveAC (`--recompute op-sac`) and FullAC, each function's job as its
registry states it (the data-parallel shard degree given by --gpus).

For each: the iteration time, the peak memory and what it fits in, per AC mode; then
(without --quick) `plan --gpus N --global-batch-size B` with SelectiveAC and with FullAC:
the best shape each finds, to show where the cheaper recompute is worth its memory.

Run: .venv/bin/python benchmarks/bench_op_sac.py [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

PPSIM = [sys.executable, "-m", "ppsim.cli"]
H100 = ["--hardware", "h100-80gb"]
MODES = ("none", "selective", "full")
"""torchtitan's activation-checkpoint subcommands, cheapest recompute first."""


@dataclass(frozen=True, kw_only=True)
class Case:
    function: str
    gpus: int
    """The world the registry's shard degree of -1 takes."""
    extra: tuple[str, ...] = ()
    """Sizes the function leaves at 1 that its model needs to fit (pp for DeepSeek-V3)."""
    global_batch: int = 0
    """Sequences a step for the plan (0: no plan)."""


CASES = (
    Case(function="llama3_8b", gpus=8, global_batch=64),
    Case(function="llama3_70b", gpus=64, global_batch=128),
    Case(function="qwen3_30b_a3b", gpus=64, global_batch=256),
    Case(function="deepseek_v3_671b", gpus=1024, global_batch=1024,
         extra=("--parallelism.pipeline_parallel_degree", "16",
                "--parallelism.expert_parallel_degree", "8")),
)


def _json(argv: list[str]) -> dict:
    r = subprocess.run([*PPSIM, *argv, "--json"], capture_output=True, text=True, check=False)
    if r.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def simulate_row(case: Case, mode: str) -> str:
    out = _json(["simulate", *H100, "--torchtitan-config", case.function, "--gpus",
                 str(case.gpus), *case.extra, f"activation-checkpoint:{mode}"])
    peak = max(r["peak_memory_bytes"] for r in out["ranks"]) / 1e9
    fits = "fits" if out["fits"] else "OOM"
    return (f"{case.function:18} {mode:10} {out['iteration_time_ms']:10,.0f} ms "
            f"{peak:8.1f} GB {fits:5} {out['throughput']['tflops_per_gpu']:7.0f} TFLOP/s/GPU")


def plan_row(case: Case, mode: str) -> str:
    start = time.perf_counter()
    out = _json(["plan", *H100, "--torchtitan-config", case.function, "--gpus",
                 str(case.gpus), "--global-batch-size", str(case.global_batch),
                 f"activation-checkpoint:{mode}"])
    best = out["best"]
    shape = (f"tp{best['tp']} cp{best['cp']} ep{best['ep']} pp{best['pp']} dp{best['dp']} "
             f"vpp{best['vpp']} mbs{best['micro_batch_size']}")
    return (f"{case.function:18} {mode:10} {best['iteration_time_ms']:10,.0f} ms "
            f"{best['peak_memory_bytes'] / 1e9:6.1f} GB  {shape}  "
            f"({time.perf_counter() - start:.1f} s)")


def main() -> None:
    print("each registry function's job, per activation-checkpoint mode (h100-80gb)")
    for case in CASES:
        for mode in MODES:
            print(simulate_row(case, mode))
    if "--quick" in sys.argv:
        return
    print("plan --gpus N --global-batch-size B: the best shape under each mode")
    for case in CASES:
        for mode in ("selective", "full"):
            print(plan_row(case, mode))


if __name__ == "__main__":
    main()
