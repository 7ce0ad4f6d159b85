"""What the job search's long shots buy (ppsim.job.choice.long_shots).

`ppsim plan --gpus N --global-batch-size B` plans the splits of the shapes fastest at
their default split, then, with what the budget leaves, long shots: shapes an uneven
split might make faster than the best of those. For each case the search runs twice at
the CLI's default 60 s budget, with and without the long shots, in one process; printed:
the best shape and its time each way, the gain, and the wall time each way.

Cases: models whose even split overloads one rank (a large vocabulary's head on the last
stage: gpt-oss-120b's 201,088 words, Qwen3-Next's 151,936) and the flagship plans of
bench_job.py (Llama 3.1 405B on 8,192 H100, DeepSeek-V3 on 2,048).

Run: .venv/bin/python benchmarks/bench_long_shots.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.job.search import search_job

OVERLAPS = ["--overlap-grad-reduce", "--overlap-param-gather"]
CASES = [("gpt-oss-120b", 64, 256, []),
         ("qwen3-next-80b-a3b", 64, 256, []),
         ("llama3.1-405b", 8192, 2048, [*OVERLAPS, "--tp-comm-overlap"]),
         ("deepseek-v3", 2048, 15360, OVERLAPS)]


@dataclass(frozen=True, kw_only=True)
class Best:
    """A search's best shape that fits."""

    row: str
    """Its time, the search's wall time and its shape, as the table prints them."""
    ms: float
    """Its iteration time."""


def best_of(preset: str, gpus: int, gbs: int, flags: list[str], shots: bool) -> Best:
    """The best shape that fits, with or without long shots."""
    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", preset, "--hardware", "h100-80gb", *flags]))
    t0 = time.perf_counter()
    res = search_job(cfg, gpus, gbs, shots=shots)
    seconds = time.perf_counter() - t0
    best = next(r for r in res.candidates if r.summary.fits)
    return Best(row=f"{best.summary.iteration_time_ms:9.0f} {seconds:6.1f}  "
                    f"{best.shape.label()}", ms=best.summary.iteration_time_ms)


def main() -> None:
    print(f"{'case':32} {'long shots':>10} {'best ms':>9} {'wall s':>6}  shape")
    for preset, gpus, gbs, flags in CASES:
        name = f"{preset} on {gpus:,}"
        without = best_of(preset, gpus, gbs, flags, shots=False)
        with_ = best_of(preset, gpus, gbs, flags, shots=True)
        print(f"{name:32} {'no':>10} {without.row}")
        print(f"{'':32} {'yes':>10} {with_.row}   ({without.ms / with_.ms - 1:+.1%} throughput)")


if __name__ == "__main__":
    main()
