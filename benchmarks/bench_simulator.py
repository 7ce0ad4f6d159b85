"""Simulator speed, whole process: `ppsim simulate` against a bare simpy loop.

The reference is the least a simpy simulation of the same run can do: one
process per rank walking the 1F1B order, one event per message, nothing
else (no config, no costs, no memory, no output). Both are timed as whole
processes (interpreter start, imports, everything), best of REPEAT runs.
Target (issue 15): `ppsim simulate` 1F1B pp 64 x 1024 microbatches within
1.2x of the bare loop. Also: the fast evaluator agrees with the simulator,
and per-case in-process times.

Run: .venv/bin/python benchmarks/bench_simulator.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

PP, M = 64, 1024
F_MS, B_MS, LATENCY_MS, BANDWIDTH_GBPS, OUT_BYTES = 1.0, 2.0, 0.01, 10.0, 100
REPEAT = 5

CASES = [
    ("1f1b", 64, 1, 1024),
    ("interleaved-1f1b", 32, 2, 512),
]


def bare_simpy(pp: int, m: int) -> float:
    """1F1B with simpy and nothing else; returns the iteration time."""
    import simpy

    env = simpy.Environment()
    delay = LATENCY_MS + OUT_BYTES / (BANDWIDTH_GBPS * 1e6)
    inbox: dict[tuple[int, int, int], simpy.Event] = {}

    def box(key: tuple[int, int, int]) -> simpy.Event:
        ev = inbox.get(key)
        if ev is None:
            ev = inbox[key] = env.event()
        return ev

    def send(key: tuple[int, int, int]) -> None:
        env.timeout(delay).callbacks.append(lambda _e: box(key).succeed())

    def rank(r: int):  # type: ignore[no-untyped-def]
        warm = min(pp - r - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        order += [("B", i) for i in range(m - warm, m)]
        for kind, i in order:
            if kind == "F":
                if r > 0:
                    yield box((r, i, 0))
                yield env.timeout(F_MS)
                if r < pp - 1:
                    send((r + 1, i, 0))
            else:
                if r < pp - 1:
                    yield box((r, i, 1))
                yield env.timeout(B_MS)
                if r > 0:
                    send((r - 1, i, 1))

    for r in range(pp):
        env.process(rank(r))
    env.run()
    return env.now


def _whole(cmd: list[str]) -> tuple[float, str]:
    best, out = float("inf"), ""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        best = min(best, time.perf_counter() - t0)
    return best, out


def whole_process() -> None:
    bare_s, bare_out = _whole([sys.executable, __file__, "--bare"])
    ppsim_s, out = _whole([sys.executable, "-m", "ppsim.cli", "simulate", "--json",
                           "--pp", str(PP), "--microbatches", str(M), "--schedule", "1f1b",
                           "--config", _config_file()])
    t_bare, t_ppsim = float(bare_out), json.loads(out)["iteration_time_ms"]
    assert abs(t_bare - t_ppsim) < 1e-6 * t_bare, (t_bare, t_ppsim)
    print(f"whole process, 1f1b pp {PP} x {M} microbatches ({2 * PP * M:,} ops), best of "
          f"{REPEAT}: bare simpy loop {bare_s:.3f} s, ppsim simulate --json {ppsim_s:.3f} s, "
          f"ratio {ppsim_s / bare_s:.2f}x (target <= 1.2x)")


def _config_file() -> str:
    path = os.path.join(tempfile.mkdtemp(prefix="ppsim-bench-"), "sim_1f1b.toml")
    text = (f'[model]\nkind = "uniform"\nnum_layers = {PP}\nforward_ms = {F_MS}\n'
            f'backward_ms = {B_MS}\nactivation_bytes = 1000\noutput_bytes = {OUT_BYTES}\n'
            f'static_bytes = 10\n\n[pipeline]\npp = {PP}\nmicrobatches = {M}\n'
            f'schedule = "1f1b"\n\n[hardware]\nmemory_bytes = 1e12\n'
            f'p2p_latency_ms = {LATENCY_MS}\np2p_bandwidth_gbps = {BANDWIDTH_GBPS}\n')
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def in_process() -> None:
    import resource

    from ppsim.config.schema import config_from_dict
    from ppsim.pipeline.problem import build_problem
    from ppsim.sim.evaluate import evaluate
    from ppsim.sim.simulate import simulate
    from ppsim.sim.timing import compile_schedule, op_table

    print(f"{'schedule':18} {'pp':>3} {'vpp':>3} {'m':>5} {'ops':>8} {'sim s':>8} "
          f"{'sim+rec s':>9} {'fast s':>8} {'iter ms':>10}")
    for name, pp, vpp, m in CASES:
        cfg = config_from_dict({
            "model": {"kind": "uniform", "num_layers": pp * vpp * 2, "forward_ms": F_MS,
                      "backward_ms": B_MS, "activation_bytes": 1000, "output_bytes": OUT_BYTES,
                      "static_bytes": 10},
            "pipeline": {"pp": pp, "vpp": vpp, "microbatches": m, "schedule": name},
            "hardware": {"memory_bytes": 1e12, "p2p_latency_ms": LATENCY_MS,
                         "p2p_bandwidth_gbps": BANDWIDTH_GBPS},
        })
        problem = build_problem(cfg)
        t0 = time.perf_counter()
        sim = simulate(problem, record=False)
        t1 = time.perf_counter()
        simulate(problem)
        t2 = time.perf_counter()
        table = op_table(compile_schedule(problem.schedule), problem.stage_costs,
                         problem.hardware.transfer_ms)
        fast = evaluate(table, [problem.split.rank_layers(r) for r in range(pp)], 1e12)
        t3 = time.perf_counter()
        assert fast == sim.summary
        print(f"{name:18} {pp:3} {vpp:3} {m:5} {problem.schedule.num_ops:8} {t1 - t0:8.3f} "
              f"{t2 - t1:9.3f} {t3 - t2:8.3f} {sim.summary.iteration_time_ms:10.1f}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    if sys.argv[1:] == ["--bare"]:
        print(bare_simpy(PP, M))
    else:
        whole_process()
        in_process()
