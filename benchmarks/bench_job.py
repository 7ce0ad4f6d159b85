"""The whole job against published runs, and `plan --gpus` at scale (issue 24).

1. Megatron-LM's README weak-scaling rows without pipeline parallelism (H100, sequence
   4096, vocabulary 131,072, data-parallel 48, global batch 192, GPT models with a 4h MLP,
   the distributed optimizer and the README's overlaps: --tp-comm-overlap,
   --overlap-grad-reduce, --overlap-param-gather): ppsim's predicted TFLOP/s per GPU
   against the published one, nothing fitted. The README's figures date from July 2024,
   when Megatron counted the whole s x s attention (the causal halving came in March
   2025, commit 8873b55d6a); the prediction is converted with that count too, and shown
   with today's.
2. `ppsim plan --gpus 8192` on the 405B preset (global batch 2048 x 8192 tokens, Llama 3's
   16M) and DeepSeek-V3 on 2,048 GPUs (global batch 15,360 x 4096, the paper's last):
   wall time of the whole process and the top-3 shapes with their throughput.

3. With --measure DIR (on a GPU: `bash benchmarks/gpu_checks.sh job`), each weak-scaling
   row's own kernels are measured on this device (`ppsim profile --hardware-out` at the
   row's model, after a warm-up to the power-saturated clock) into DIR/weak-<row>.toml;
   with --measured DIR the rows are predicted again with those matmul and attention
   efficiencies over the h100-80gb preset. An H200 has the H100 SXM's GH100 die, peak and
   700 W, so its compute rates stand for the H100's; memory, links and topology stay the
   preset's datasheet figures.

Run: .venv/bin/python benchmarks/bench_job.py [--quick] [--measure DIR] [--measured DIR]
     (--quick: the weak-scaling rows only)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from ppsim.config.schema import config_from_dict
from ppsim.job.flops import iteration_flops
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

# name, hidden, layers, heads, tp, published TFLOP/s per GPU (Megatron-LM README)
WEAK = [("1.7B", 2048, 24, 16, 1, 408.8), ("7.1B", 4096, 30, 32, 2, 465.9),
        ("16B", 6144, 32, 48, 4, 489.1), ("32B", 7168, 48, 56, 8, 459.6)]


MEASURED_KEYS = ("matmul_efficiency", "attention_efficiency")
"""What a measured [hardware] table lends the H100 preset: the compute rates alone."""


def weak_config(hidden: int, layers: int, heads: int, tp: int,
                measured: dict[str, Any] | None = None) -> Any:
    hardware = {"preset": "h100-80gb",
                **{k: v for k, v in (measured or {}).items() if k in MEASURED_KEYS}}
    return config_from_dict({
        "model": {"kind": "transformer", "num_layers": layers, "hidden_size": hidden,
                  "num_heads": heads, "num_kv_heads": heads, "ffn_hidden_size": 4 * hidden,
                  "vocab_size": 131072, "seq_length": 4096, "micro_batch_size": 1,
                  "gated_mlp": False, "tp": tp, "dp": 48, "distributed_optimizer": True,
                  "recompute": "selective", "dropout": True},
        "pipeline": {"pp": 1, "global_batch_size": 192, "tp_comm_overlap": True,
                     "overlap_grad_reduce": True, "overlap_param_gather": True},
        "hardware": hardware})


def weak_row(hidden: int, layers: int, heads: int, tp: int,
             measured: dict[str, Any] | None = None) -> tuple[float, float, float]:
    """(iteration ms, TFLOP/s/GPU as counted today, as counted in July 2024)."""
    problem = build_problem(weak_config(hidden, layers, heads, tp, measured))
    ms = simulate(problem, record=False).summary.iteration_time_ms
    gpus = tp * 48
    arch = problem.hardware.job.arch  # type: ignore[union-attr]
    now = iteration_flops(arch, 192) / (ms / 1e3) / gpus / 1e12
    then = iteration_flops(arch, 192, causal=False) / (ms / 1e3) / gpus / 1e12
    return ms, now, then


def plan_case(label: str, argv: list[str]) -> None:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", "plan", *argv, "--top", "3",
                          "--json"], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 3):
        print(f"{label}: exit {out.returncode}: {out.stderr.strip()}")
        return
    doc = json.loads(out.stdout)
    print(f"{label}: {wall:.1f} s whole process, {doc['evaluated']} of {doc['total_shapes']} "
          "shapes")
    for c in doc["candidates"]:
        t = c["throughput"]
        print(f"   tp{c['tp']} cp{c['cp']} ep{c['ep']} pp{c['pp']} dp{c['dp']} vpp{c['vpp']} "
              f"mbs{c['micro_batch_size']}: {c['iteration_time_ms']:.0f} ms, "
              f"{t['tflops_per_gpu']:.0f} TFLOP/s/GPU, MFU {t['mfu']:.1%}, "
              f"{t['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, peak "
              f"{c['peak_memory_bytes'] / 1e9:.1f} GB, {c['held_back_by']}")


def measure_rows(out: Path, device: str = "cuda") -> None:
    """Each row's kernels on this GPU into out/weak-<row>.toml, every measurement in
    out/weak-measurements.json."""
    from ppsim.executor.hwprofile import hardware_toml, measure_hardware
    from ppsim.fileio import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    everything = {}
    for i, (name, h, layers, heads, tp, _) in enumerate(WEAK):
        t0 = time.perf_counter()
        # The first row warms the device up to its settled clock; the rest keep it there.
        result = measure_hardware(device, model=weak_config(h, layers, heads, tp).model.arch,
                                  sustained_s=8.0 if i == 0 else 2.0)
        write_text_atomic(str(out / f"weak-{name}.toml"), hardware_toml(result))
        everything[name] = result
        write_text_atomic(str(out / "weak-measurements.json"), json.dumps(everything, indent=1))
        m = result["measurements"]
        rates = [x["tflops"] for x in m["model_matmuls"]]
        att = m["model_attention"]
        kernels = ", ".join(f"{k} {v['tflops']:.0f}" for k, v in att["kernels"].items())
        print(f"measured {name}: matmuls {min(rates):.0f}-{max(rates):.0f} TFLOP/s, attention "
              f"{kernels} (kept {att['kernel']}), settled {m['settled_tflops']:.0f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)


def table(measured: Path | None) -> None:
    label = f"kernels measured in {measured}" if measured else "the h100-80gb preset"
    print(f"weak scaling, {label}")
    print(f"{'model':6} {'tp':>3} {'GPUs':>5} {'iter ms':>8} {'TFLOP/s now':>11} "
          f"{'as in 2024':>10} {'published':>9} {'error':>7}")
    for name, h, layers, heads, tp, published in WEAK:
        hw = (tomllib.loads((measured / f"weak-{name}.toml").read_text())["hardware"]
              if measured else None)
        ms, now, then = weak_row(h, layers, heads, tp, hw)
        print(f"{name:6} {tp:3} {48 * tp:5} {ms:8.1f} {now:11.1f} {then:10.1f} "
              f"{published:9.1f} {then / published - 1:+7.1%}")


def _dir_after(flag: str) -> Path | None:
    return Path(sys.argv[sys.argv.index(flag) + 1]) if flag in sys.argv else None


def main() -> None:
    measure, measured = _dir_after("--measure"), _dir_after("--measured")
    if measure:
        measure_rows(measure)
        measured = measured or measure
    table(None)
    if measured:
        table(measured)
    if "--quick" in sys.argv or measure:
        return
    plan_case("llama3.1-405b on 8,192 H100", ["--preset", "llama3.1-405b", "--hardware",
                                              "h100-80gb", "--gpus", "8192",
                                              "--global-batch-size", "2048",
                                              "--overlap-grad-reduce", "--overlap-param-gather",
                                              "--tp-comm-overlap"])
    plan_case("deepseek-v3 on 2,048 H100", ["--preset", "deepseek-v3", "--hardware",
                                            "h100-80gb", "--gpus", "2048",
                                            "--global-batch-size", "15360",
                                            "--overlap-grad-reduce", "--overlap-param-gather"])


if __name__ == "__main__":
    main()
