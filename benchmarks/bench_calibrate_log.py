"""How far one logged iteration carries: `ppsim calibrate --log`'s one factor, fitted on
one run of Megatron-LM's weak-scaling table (bench_job.py's runs, as a user's log of that
run would give it), then the other runs predicted with the calibrated [hardware] table.

This is the calibration a user runs on their own job's log, not a model constant: the
presets stay datasheet figures and measured kernels, and bench_job.py's table (issue 24's
target) is predicted with them alone. Here each published run in turn plays the user's
log, to show how well one factor, fitted on one shape, prices the others.

Run: .venv/bin/python benchmarks/bench_calibrate_log.py
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_job import HELD_OUT, WEAK, PublishedRun, run_config  # noqa: E402

from ppsim.config.compute_scale import (  # noqa: E402
    SCALE_RANGE,
    ScaleFit,
    fastest_scale,
    fit_scale,
    scaled_compute,
)
from ppsim.job.flops import iteration_flops  # noqa: E402
from ppsim.pipeline.problem import build_problem  # noqa: E402
from ppsim.sim.simulate import simulate  # noqa: E402

RUNS = WEAK + HELD_OUT
SOURCES = ("177B@96", "1.7B", "70B")
"""The runs that play the log: the compute-bound one (576 microbatches a replica), the
smallest, and the first with a pipeline."""


def _iteration_ms(run: PublishedRun, factor: float) -> float:
    cfg = run_config(run)
    cfg = replace(cfg, hardware=scaled_compute(cfg.hardware, factor))
    return simulate(build_problem(cfg), record=False).summary.iteration_time_ms


def _published_ms(run: PublishedRun) -> float:
    """The iteration the published TFLOP/s per GPU implies (Megatron's July 2024 count)."""
    arch = build_problem(run_config(run)).hardware.job.arch  # type: ignore[union-attr]
    return iteration_flops(arch, run.global_batch, causal=False) / (
        run.tflops * 1e12 * run.gpus) * 1e3


def main() -> None:
    t0 = time.perf_counter()
    low = max(SCALE_RANGE[0], fastest_scale(run_config(RUNS[0]).hardware))
    published = {r.name: _published_ms(r) for r in RUNS}
    preset = {r.name: _iteration_ms(r, 1.0) for r in RUNS}
    print("| log of | factor | " + " | ".join(r.name for r in RUNS) + " |")
    print("|---|---|" + "---|" * len(RUNS))
    print("| none (the preset) | 1 | " + " | ".join(
        f"{published[r.name] / preset[r.name] - 1:+.1%}" for r in RUNS) + " |")
    for name in SOURCES:
        source = next(r for r in RUNS if r.name == name)
        fit = fit_scale(lambda k, s=source: _iteration_ms(s, k), published[name], low,
                        SCALE_RANGE[1])
        assert isinstance(fit, ScaleFit), fit
        cells = [f"{published[r.name] / _iteration_ms(r, fit.factor) - 1:+.1%}"
                 if r.name != name else "(fitted)" for r in RUNS]
        print(f"| {name} | {fit.factor:.3f} | " + " | ".join(cells) + " |")
    print(f"\nTFLOP/s per GPU, predicted over published - 1; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
