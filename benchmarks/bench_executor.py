"""Executor overhead on CPU: ppsim's runtime vs torch.distributed.pipelining, same split.

Two models, 2 ranks (gloo), 1F1B, 8 microbatches, split [5, 3]: the tiny preset
(overhead-bound) and a compute-heavy GPT (hidden 256, seq 256, micro-batch 4).
Both engines run the same model, data and split with return_outputs=False on the
torch side, in the same processes: `ppsim run --alongside-torch` alternates the two
engines iteration by iteration and times both alike (barrier to the end of the
optimizer step, slowest rank), so the machine's drift, which moves single launches of
one config by 10-20 % on this VM, hits both alike. The goal is a ratio <= 1.0 (ppsim
at least as fast), best of 3 launches (each engine's median iteration per launch).
`--separate` launches the engines one after the other instead (the old protocol).

Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_executor.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


HEAVY = """[model]
preset = "tiny-gpt"
hidden_size = 256
num_heads = 8
num_kv_heads = 8
ffn_hidden_size = 1024
seq_length = 256
micro_batch_size = 4
"""
"""A GPT where compute, not per-op overhead, sets the pace on CPU."""


def run(engine: str, device: str, iterations: int, warmup: int,
        model: str, extra: tuple[str, ...] = ()) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        config: list[str] = ["--preset", "tiny-gpt"]
        if model == "heavy":
            path = Path(tmp) / "heavy.toml"
            path.write_text(HEAVY)
            config = ["--config", str(path)]
        cmd = [sys.executable, "-m", "ppsim.cli", "run", *config, "--pp", "2",
               "--schedule", "1f1b", "--microbatches", "8", "--split", "5,3",
               "--engine", engine, "--device", device, "--iterations", str(iterations),
               "--warmup", str(warmup), "--trace-dir", str(Path(tmp) / "run"), "--json",
               *extra]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
        if res.returncode != 0:
            print(f"{engine} run failed: {res.stderr.strip().splitlines()[:3]}")
            return None
        return json.loads(res.stdout)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="both", choices=("tiny", "heavy", "both"))
    p.add_argument("--separate", action="store_true",
                   help="launch the engines one after the other (alternating launches)")
    a = p.parse_args()
    for model in ("tiny", "heavy") if a.model == "both" else (a.model,):
        bench(a, model)


def bench(a: argparse.Namespace, model: str) -> None:
    times: dict[str, list[float]] = {"ppsim": [], "torch": []}
    last: dict[str, dict] = {}
    for _ in range(a.rounds):
        if a.separate:
            got = {e: run(e, a.device, a.iterations, a.warmup, model) for e in times}
        else:
            both = run("ppsim", a.device, a.iterations, a.warmup, model, ("--alongside-torch",))
            got = {"ppsim": both, "torch": both and both["peer"]}
        for engine, res in got.items():
            if res is not None:
                last[engine] = res
                # median over the recorded iterations of this launch
                times[engine].append(statistics.median(res["iteration_times_ms"]))
    if "ppsim" not in last:
        sys.exit("the ppsim executor did not run")
    info = last["ppsim"]
    print(f"{model}: pp 2, 1f1b, 8 microbatches, split [5, 3], device {a.device} "
          f"({info['backend']}, transfers via {info['wire']})")
    print(f"{'engine':28} {'iteration ms':>12} {'tokens/s':>10} {'loss':>8}")
    best = {e: min(t) for e, t in times.items() if t}
    for engine, name in (("ppsim", "ppsim executor"), ("torch", "torch.distributed.pipelining")):
        if engine not in best:
            print(f"{name:28} {'failed':>12}")
            continue
        res, t = last[engine], best[engine]
        tokens = res["tokens_per_s"] * res["iteration_time_ms"] / t  # same tokens, time t
        print(f"{name:28} {t:12.2f} {tokens:10,.0f} {res['loss']:8.4f}")
    if "torch" in best:
        how = "separate launches" if a.separate else "both engines in each launch, alternating"
        print(f"ratio ppsim / torch = {best['ppsim'] / best['torch']:.3f}  (goal <= 1.0; best "
              f"of {a.rounds} launches, median of {a.iterations - a.warmup} iterations each; "
              f"{how})")
        if len(times["torch"]) == len(times["ppsim"]):
            print("per launch: " + ", ".join(f"{x / y:.3f}" for x, y in
                                              zip(times["ppsim"], times["torch"], strict=True)))
    if "ranks" in info:
        print("ppsim per rank (last launch): " + ", ".join(
            f"rank {r['rank']} busy {r['busy_ms']:.2f} ms bubble {r['bubble_fraction']:.0%}"
            for r in info["ranks"]))


if __name__ == "__main__":
    main()
