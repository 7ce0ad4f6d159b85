"""Planner speed: the planner issue's targets (80 layers pp 8: < 3 s; 128 layers pp 16: < 10 s).

Run: .venv/bin/python benchmarks/bench_planner.py
"""

from __future__ import annotations

import time

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.plan.planner import plan

HEAVY_HEAD = {"kind": "uniform", "num_layers": 128, "forward_ms": 1.0, "backward_ms": 2.0,
              "static_bytes": 10**9, "activation_bytes": 10**8, "output_bytes": 10**7,
              "head": {"forward_ms": 6.0, "backward_ms": 12.0, "static_bytes": 4 * 10**9}}

CASES = [
    ("llama3-70b, 80 layers, 1f1b", {"preset": "llama3-70b"}, 8, 64, "h100-80gb"),
    ("llama3-70b-like, 128 layers, 1f1b", {"preset": "llama3-70b", "num_layers": 128}, 16, 128,
     "h100-80gb"),
    ("gpt3-175b-like, 128 layers, 1f1b", {"preset": "gpt3-175b", "num_layers": 128}, 16, 128,
     "h100-80gb"),
    ("uniform, heavy head, 128 layers", HEAVY_HEAD, 16, 128, "h100-80gb"),
]

NO_FIT = [
    ("deepseek-v3, pp 8 vpp 2 (activations)", "deepseek-v3", 8, 2),
    ("qwen3-next, pp 2 vpp 4 (weights, state)", "qwen3-next-80b-a3b", 2, 4),
]
"""Plans where no split fits 80 GB: the answer (exit 3, and what can help) comes from the
memory floor, whatever the budget."""


def no_fit() -> None:
    print(f"\n{'nothing fits':40} {'seconds':>8} {'timed':>6} {'floor GB':>9} {'state GB':>9}")
    for label, preset, pp, vpp in NO_FIT:
        cfg = config_from_dict({"model": {"preset": preset}, "hardware": {"preset": "h100-80gb"},
                                "pipeline": {"pp": pp, "vpp": vpp, "microbatches": 8,
                                             "schedule": "interleaved-1f1b"}})
        problem = build_problem(cfg)
        t0 = time.perf_counter()
        res = plan(problem, top_k=5, time_budget_s=60)
        dt = time.perf_counter() - t0
        assert res.best is None and res.floor is not None
        print(f"{label:40} {dt:8.2f} {res.evaluated:6} {res.floor.peak_bytes / 1e9:9.1f} "
              f"{res.floor.static_bytes / 1e9:9.1f}")


def main() -> None:
    print(f"{'case':36} {'pp':>3} {'m':>4} {'seconds':>8} {'timed':>7} {'possible':>10} "
          f"{'proven':>6} {'gap':>6} {'best ms':>10} {'even ms':>10} {'speed-up':>8}")
    for label, model, pp, m, hw in CASES:
        cfg = config_from_dict({"model": model, "hardware": {"preset": hw},
                                "pipeline": {"pp": pp, "microbatches": m, "schedule": "1f1b"}})
        problem = build_problem(cfg)
        t0 = time.perf_counter()
        res = plan(problem, top_k=5, time_budget_s=10)
        dt = time.perf_counter() - t0
        best = res.best.summary.iteration_time_ms if res.best else float("nan")
        even = res.baseline.summary.iteration_time_ms if res.baseline else float("nan")
        print(f"{label:36} {pp:3} {m:4} {dt:8.2f} {res.evaluated:7} {res.total_splits:10.2e} "
              f"{str(res.proven_optimal):>6} {(best - res.lower_bound_ms) / best:6.2%} "
              f"{best:10.1f} {even:10.1f} {even / best:8.3f}")
    no_fit()


if __name__ == "__main__":
    main()
