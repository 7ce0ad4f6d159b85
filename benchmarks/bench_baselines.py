"""The plan's speed-up over what each framework does by its own rule, on public models.

For each case: `ppsim plan`'s best split and its simulated speed-up over Megatron's
baseline (even, or its fastest first/last split), DeepSpeed's `parameters` and
`uniform` partitions and torchtitan's default split (ppsim.plan.baselines), all timed
by the same simulator. A framework with no split for the shape prints "-".

Run: .venv/bin/python benchmarks/bench_baselines.py
"""

from __future__ import annotations

import time

from ppsim.cli.plan import plan_with_references
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem

CASES = [
    ("llama3-8b", "h100-80gb", 4, 32),
    ("llama3-70b", "h100-80gb", 8, 64),
    ("gpt3-175b", "h100-80gb", 8, 64),
    ("llama3.1-405b", "h100-80gb", 16, 128),
    ("qwen3-235b-a22b", "h100-80gb", 8, 64),
    ("mixtral-8x7b", "h100-80gb", 4, 32),
]
KEYS = ("megatron", "deepspeed_parameters", "deepspeed_uniform", "torchtitan")


def main() -> None:
    print(f"{'model':16} {'pp':>3} {'m':>4} {'best split':28} "
          + " ".join(f"{k:>20}" for k in KEYS) + f" {'s':>5}")
    for preset, hw, pp, m in CASES:
        cfg = config_from_dict({"model": {"preset": preset}, "hardware": {"preset": hw},
                                "pipeline": {"pp": pp, "microbatches": m, "schedule": "1f1b"}})
        t0 = time.perf_counter()
        planned = plan_with_references(build_problem(cfg), [], top_k=1, budget_s=30)
        best = planned.result.best
        if best is None:
            print(f"{preset:16} {pp:3} {m:4} nothing fits")
            continue
        t = best.summary.iteration_time_ms
        by_key = {r.key: r for r in planned.baselines()}
        cells = []
        for k in KEYS:
            r = by_key.get(k)
            cells.append("-" if r is None else
                         f"{r.summary.iteration_time_ms / t:.3f}x"
                         + ("" if r.summary.fits else " OOM"))
        split = ",".join(map(str, best.split.counts))
        print(f"{preset:16} {pp:3} {m:4} {split[:28]:28} "
              + " ".join(f"{c:>20}" for c in cells) + f" {time.perf_counter() - t0:5.1f}")


if __name__ == "__main__":
    main()
