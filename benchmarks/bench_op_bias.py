"""Which rank's ops the profile gets wrong, from `ppsim demo` output folders.

For every demo folder: each rank's F and B as measured (mean over every recorded
iteration of both launches) against the simulator's op from the same cost file with
the message CPU taken out (the runtime records an op without its messages), as a
ratio; then each ratio over the folder's mean ratio, so the VM's drift between the
profile and the run (±15 %) cancels and only a bias between ranks is left. A rank
whose normalized ratio sits above 1 is slower than the profile says, relative to the
others: the planner then gives it too much.

2026-12-01, 14 demo folders of three sessions (tiny preset, 1F1B, m 8), median
normalized ratios: even [4, 4] rank 0 F 1.04 B 1.07, rank 1 F 0.93 B 0.97; planned
[5, 3] rank 0 F 1.01 B 1.04, rank 1 F 0.94 B 0.99: the rank holding the LM head ran
5-10 % faster, relative to rank 0, than predicted, whichever core each rank was pinned
to, which put the demo's predicted speed-up 3-6 points high. Cause: the head's 1 MB
tensors paid page faults or not depending on glibc's heap of the moment (1.6 ms F with
freed memory kept, 2.0-2.9 ms without); since `executor/alloc.py` keeps freed memory in
every profiling process and rank, one folder gave: even rank 0 F 1.00 B 1.02, rank 1 F
0.97 B 0.98; planned rank 0 F 1.01 B 0.98, rank 1 F 1.01 B 1.04.

Run:    .venv/bin/python benchmarks/bench_op_bias.py OUT [OUT ...]   (ppsim demo --out OUT)
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace

from ppsim.config.schema import load_config
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.trace.read import Trace, read_trace, trace_from_json
from ppsim.trace.schema import simulation_trace

Key = tuple[int, str]
"""(rank, kind)."""


def op_means(trace: Trace) -> dict[Key, list[float]]:
    """Every recorded F and B duration (ms) by rank and kind, warm-up left out."""
    first = int(trace.info.get("warmup_iterations", 0))
    out: dict[Key, list[float]] = defaultdict(list)
    for op in trace.ops:
        if op.kind in ("F", "B") and op.iteration >= first:
            out[(op.rank, op.kind)].append(op.dur_us / 1e3)
    return out


def folder_ratios(out: str) -> dict[tuple[tuple[int, ...], Key], tuple[float, float]]:
    """(split, rank/kind) -> (simulated ms, measured ms) for one demo folder."""
    costs = json.load(open(os.path.join(out, "costs.json")))
    costs.setdefault("conditions", {})["message_cpu_ms"] = 0.0
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(costs, f)
    try:
        cfg = replace(load_config(os.path.join(out, "config.toml")), costs_file=f.name)
        real: dict[tuple[int, ...], dict[Key, list[float]]] = defaultdict(
            lambda: defaultdict(list))
        for path in sorted(glob.glob(os.path.join(out, "runs", "*", "summary.json"))):
            s = json.load(open(path))
            here = os.path.dirname(path)
            for split, trace in ((s["split"], os.path.join(here, "trace.json")),
                                 (s["versus"]["split"], os.path.join(here, "versus",
                                                                     "trace.json"))):
                for k, v in op_means(read_trace(trace)).items():
                    real[tuple(split)][k] += v
        rows = {}
        for split, ops in real.items():
            p = build_problem(replace(cfg, pipeline=replace(cfg.pipeline, split=list(split))))
            sim = op_means(trace_from_json(simulation_trace(simulate(p))))
            for k, v in ops.items():
                rows[(split, k)] = (statistics.fmean(sim[k]), statistics.fmean(v))
        return rows
    finally:
        os.unlink(f.name)


def main(folders: list[str]) -> None:
    pooled: dict[tuple[tuple[int, ...], Key], list[float]] = defaultdict(list)
    for out in folders:
        rows = folder_ratios(out)
        if not rows:
            continue
        mean = statistics.fmean(r / s for s, r in rows.values())
        print(out)
        for (split, (rank, kind)), (s, r) in sorted(rows.items()):
            pooled[(split, (rank, kind))].append(r / s / mean)
            print(f"  {list(split)!s:10} rank {rank} {kind}: simulated {s:6.2f} ms, "
                  f"measured {r:6.2f} ms, normalized ratio {r / s / mean:.3f}")
    print("all folders (median normalized ratio):")
    for (split, (rank, kind)), v in sorted(pooled.items()):
        print(f"  {list(split)!s:10} rank {rank} {kind}: {statistics.median(v):.3f} "
              f"({len(v)} folders)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: bench_op_bias.py DEMO_OUT [DEMO_OUT ...]")
    main(sys.argv[1:])
