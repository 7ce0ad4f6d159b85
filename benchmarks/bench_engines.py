"""Engine speed: the simpy engine against the event (heap) engine, in process.

The cases of bench_simulator.py (1F1B pp 64 x 1024 microbatches, interleaved 1F1B
pp 32 x vpp 2 x 512), plus the 1F1B case with every two ranks sharing a device. Each
engine simulates each case without and with per-op records, best of REPEAT; both must
give the same summary to the last digit. Prints each time and the ratio simpy / event.

Run: .venv/bin/python benchmarks/bench_engines.py
"""

from __future__ import annotations

import time
from dataclasses import replace

from bench_simulator import B_MS, BANDWIDTH_GBPS, CASES, F_MS, LATENCY_MS, OUT_BYTES

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.placement import PlacementConfig, topology
from ppsim.pipeline.problem import Problem, build_problem
from ppsim.sim.engines import ENGINES

REPEAT = 2


def problem(name: str, pp: int, vpp: int, m: int) -> Problem:
    return build_problem(config_from_dict({
        "model": {"kind": "uniform", "num_layers": pp * vpp * 2, "forward_ms": F_MS,
                  "backward_ms": B_MS, "activation_bytes": 1000, "output_bytes": OUT_BYTES,
                  "static_bytes": 10},
        "pipeline": {"pp": pp, "vpp": vpp, "microbatches": m, "schedule": name},
        "hardware": {"memory_bytes": 1e12, "p2p_latency_ms": LATENCY_MS,
                     "p2p_bandwidth_gbps": BANDWIDTH_GBPS},
    }))


def best(engine: str, p: Problem, record: bool) -> tuple[float, object]:
    t, out = float("inf"), None
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        out = ENGINES[engine](p, record=record).summary
        t = min(t, time.perf_counter() - t0)
    return t, out


def main() -> None:
    cases = [(f"{n} pp {pp} vpp {v} m {m}", problem(n, pp, v, m)) for n, pp, v, m in CASES]
    name, pp, vpp, m = CASES[0]
    shared = problem(name, pp, vpp, m)
    cfg = PlacementConfig(devices=[r // 2 for r in range(pp)])
    cases.append((f"{name} pp {pp} m {m}, 2 ranks per device",
                  replace(shared, topology=topology(cfg, pp, LATENCY_MS, BANDWIDTH_GBPS))))
    print(f"best of {REPEAT}, seconds in process")
    print(f"{'case':40} {'ops':>8} {'record':>6} {'event s':>8} {'simpy s':>8} {'ratio':>6}")
    for label, p in cases:
        for record in (False, True):
            te, se = best("event", p, record)
            ts, ss = best("simpy", p, record)
            assert ss == se, label
            print(f"{label:40} {p.schedule.num_ops:8} {str(record):>6} {te:8.3f} {ts:8.3f} "
                  f"{ts / te:5.2f}x")


if __name__ == "__main__":
    main()
