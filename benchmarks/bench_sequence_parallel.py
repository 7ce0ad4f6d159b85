"""What sequence parallelism buys a tensor-parallel job, as ppsim prices it.

Megatron-LM runs tensor parallelism without sequence parallelism unless a line says
--sequence-parallel. Without it every tensor rank keeps the hidden states between the
blocks whole (Korthikanti et al. 2022: sbh(10 + 24/t) bytes a layer against sbh 34/t),
runs the norms and residual adds on every token, all-reduces each block's output instead
of reduce-scattering it, and sends tp times the bytes between pipeline stages. For each
job below: the iteration and the fullest rank's peak with (`--tensor-model-parallel-size
N --sequence-parallel`) and without (`--tensor-model-parallel-size N`), on the H100
preset, each with its preset's recompute mode. No published figure: the prediction a user
gets before choosing.

Run: .venv/bin/python benchmarks/bench_sequence_parallel.py
"""

from __future__ import annotations

from bench_job import ppsim_json


def _job(label: str, preset: str, tp: int, pp: int, microbatches: int) -> tuple[str, list[str]]:
    return (f"{label}, tp {tp} pp {pp}, {microbatches} microbatches",
            ["--preset", preset, "--tensor-model-parallel-size", str(tp),
             "--pipeline-model-parallel-size", str(pp), "--microbatches", str(microbatches)])


JOBS = [_job("Llama 3.1 405B", "llama3.1-405b", 8, 16, 32),
        _job("Llama 3 70B", "llama3-70b", 8, 4, 16),
        _job("Llama 3 8B", "llama3-8b", 4, 1, 8),
        _job("GPT-3 175B", "gpt3-175b", 8, 8, 32)]


def main() -> None:
    print(f"{'job':<62} {'with':>22} {'without':>22} {'time':>6} {'peak':>6}")
    for label, argv in JOBS:
        runs = [ppsim_json(["simulate", *argv, "--hardware", "h100-80gb", *extra, "--json"])
                for extra in (["--sequence-parallel"], [])]
        ms = [r["iteration_time_ms"] for r in runs]
        peak = [max(rank["peak_memory_bytes"] for rank in r["ranks"]) / 1e9 for r in runs]
        cells = [f"{t:>9,.0f} ms {p:>6.1f} GB" for t, p in zip(ms, peak, strict=True)]
        print(f"{label:<62} {cells[0]:>22} {cells[1]:>22} {ms[1] / ms[0]:>5.2f}x "
              f"{peak[1] / peak[0]:>5.2f}x")


if __name__ == "__main__":
    main()
