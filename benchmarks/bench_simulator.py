"""Simulator speed: the core issue's targets (each under 1 s, peak RSS under 500 MB).

Run: .venv/bin/python benchmarks/bench_simulator.py
"""

from __future__ import annotations

import resource
import time

from ppsim.config import config_from_dict
from ppsim.evaluate import evaluate
from ppsim.problem import build_problem
from ppsim.simulator import simulate
from ppsim.timing import compile_schedule, op_table

CASES = [
    ("1f1b", 64, 1, 1024),
    ("interleaved-1f1b", 32, 2, 512),
]


def main() -> None:
    print(f"{'schedule':18} {'pp':>3} {'vpp':>3} {'m':>5} {'ops':>8} {'simpy s':>8} "
          f"{'fast s':>8} {'iter ms':>10}")
    for name, pp, vpp, m in CASES:
        cfg = config_from_dict({
            "model": {"kind": "uniform", "num_layers": pp * vpp * 2, "forward_ms": 1.0,
                      "backward_ms": 2.0, "activation_bytes": 1000, "output_bytes": 100,
                      "static_bytes": 10},
            "pipeline": {"pp": pp, "vpp": vpp, "microbatches": m, "schedule": name},
            "hardware": {"memory_bytes": 1e12, "p2p_latency_ms": 0.01,
                         "p2p_bandwidth_gbps": 10.0},
        })
        problem = build_problem(cfg)
        t0 = time.perf_counter()
        sim = simulate(problem)
        t1 = time.perf_counter()
        table = op_table(compile_schedule(problem.schedule), problem.stage_costs,
                         problem.hardware.transfer_ms)
        fast = evaluate(table, [problem.split.rank_layers(r) for r in range(pp)], 1e12)
        t2 = time.perf_counter()
        assert fast == sim.summary
        print(f"{name:18} {pp:3} {vpp:3} {m:5} {problem.schedule.num_ops:8} {t1 - t0:8.3f} "
              f"{t2 - t1:8.3f} {sim.summary.iteration_time_ms:10.1f}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
