"""The whole job against published runs, and `plan --gpus` at scale (issue 24).

1. Megatron-LM's weak-scaling table (Megatron-Core r0.8.0 on H100, README of July 2024,
   images/model_table.png at commit f2e5db402c; sequence 4096, vocabulary 131,072,
   data-parallel 48, GPT models with a 4h MLP and untied embeddings (the sizes the table
   names are the untied counts: 24 x 12 x 2048^2 + 2 x 131,072 x 2048 = 1.75B, tied
   1.48B; 7.11B against 6.58B), the distributed optimizer and the README's overlaps:
   --tp-comm-overlap, --overlap-grad-reduce, --overlap-param-gather, pipeline-parallel
   communication overlapped by default):
   ppsim's predicted TFLOP/s per GPU against the published one, nothing fitted.
   - the rows without pipeline parallelism (1.7B to 32B): the target;
   - held out, to check the pipeline part: the rows with pp 2 to 16 (70B to 462B), and
     the strong-scaling figure's two ends (the 177B model on 96 and 4,608 GPUs at global
     batch 1,152; the README's text gives their MFU, 47 % and 42 % of 989; the shape is
     the weak table's 177B one, tp 8 pp 6, whose 2,304-GPU row lies on that curve).
   Each target row also gives, in ms of compute, ppsim's, the least any H100 could take
   (CEILING) and the most the published time leaves (Room): where the room falls below
   the floor, no compute rate reaches the published time at that micro-batch size.
   The README's figures date from July 2024, when Megatron counted the whole s x s
   attention (the causal halving came in March 2025, commit 8873b55d6a); the prediction
   is converted with that count too, and shown with today's.
2. `ppsim plan --gpus 8192` on the 405B preset (global batch 2048 x 8192 tokens, Llama 3's
   16M; again with `--search policy`, the memory policy planned too) and DeepSeek-V3 on
   2,048 GPUs (global batch 15,360 x 4096, the paper's last; again with `--search
   cp-comm`, context parallelism's traffic searched too): wall time of the whole process
   and the top-3 shapes with their throughput.

3. With --measure DIR (on a GPU: `bash benchmarks/gpu_checks.sh job`), each model's own
   kernels are measured on this device (`ppsim profile --hardware-out` at the row's
   model, after a warm-up to the power-saturated clock) into DIR/weak-<model>.toml;
   with --measured DIR the rows are predicted again with those matmul and attention
   efficiencies over the h100-80gb preset. An H200 has the H100 SXM's GH100 die, peak and
   700 W, so its compute rates stand for the H100's; memory, links and topology stay the
   preset's datasheet figures.

Run: .venv/bin/python benchmarks/bench_job.py [--quick] [--measure DIR] [--measured DIR]
                                             [--micro-batch-size N]
     (--quick: the published runs only, no plans; the table gives no micro-batch size,
     so 1 unless --micro-batch-size gives another)
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ppsim.cli.main import main as ppsim
from ppsim.config.schema import config_from_dict
from ppsim.job.exposure import exposed_comm_ms
from ppsim.job.flops import iteration_flops
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

H100_PEAK = 989.0
"""Dense bf16 TFLOP/s of an H100 SXM: the MFU denominator of the README's table."""


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One Megatron-LM run on H100 as the README reports it."""

    name: str
    model: str
    """The model's size label; runs of one model share its measured kernels."""
    hidden: int
    layers: int
    heads: int
    tp: int
    pp: int = 1
    dp: int = 48
    global_batch: int = 192
    tflops: float
    """Published TFLOP/s per GPU (Megatron's July 2024 count)."""
    micro_batch_size: int = 1
    """The table gives none: 1 unless --micro-batch-size says otherwise."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


def _weak(model: str, hidden: int, layers: int, heads: int, tp: int, pp: int, batch: int,
          tflops: float) -> PublishedRun:
    return PublishedRun(name=model, model=model, hidden=hidden, layers=layers, heads=heads,
                        tp=tp, pp=pp, global_batch=batch, tflops=tflops)


WEAK = [_weak("1.7B", 2048, 24, 16, 1, 1, 192, 408.8),
        _weak("7.1B", 4096, 30, 32, 2, 1, 192, 465.9),
        _weak("16B", 6144, 32, 48, 4, 1, 192, 489.1),
        _weak("32B", 7168, 48, 56, 8, 1, 192, 459.6)]
"""The weak-scaling rows without pipeline parallelism: the target (within 10 %)."""

_STRONG = dict(model="177B", hidden=12288, layers=96, heads=96, tp=8, pp=6, global_batch=1152)
HELD_OUT = [_weak("70B", 8192, 84, 64, 8, 2, 384, 419.7),
            _weak("119B", 10240, 92, 80, 8, 4, 768, 420.5),
            _weak("177B", 12288, 96, 96, 8, 6, 1152, 432.8),
            _weak("314B", 16384, 96, 128, 8, 8, 1536, 474.4),
            _weak("462B", 18432, 112, 144, 8, 16, 3072, 459.9),
            PublishedRun(name="177B@96", dp=2, tflops=0.47 * H100_PEAK, **_STRONG),
            PublishedRun(name="177B@4608", dp=96, tflops=0.42 * H100_PEAK, **_STRONG)]
"""Held out to check the pipeline part: the weak-scaling rows with pp > 1 and the
strong-scaling figure's two ends (their MFU as the README's text rounds it)."""


MEASURED_KEYS = ("matmul_efficiency", "attention_efficiency")
"""What a measured [hardware] table lends the H100 preset: the compute rates alone."""


CEILING = {"matmul_efficiency": [[0.001, 745.0 / H100_PEAK], [1e6, 745.0 / H100_PEAK]],
           "attention_efficiency": 0.75, "memory_bandwidth_gbps": 3350.0,
           "kernel_overhead_us": 0.0, "intra_node_bandwidth_gbps": 1e5,
           "inter_node_bandwidth_gbps": 1e5, "intra_node_latency_us": 0.0,
           "inter_node_latency_us": 0.0}
"""Compute rates no H100 job beats, generous on every count: every matmul at 745
TFLOP/s whatever its size (the top of the 700-745 ml-engineering measured sustained on
the GH100 die, MSMF), attention at FlashAttention-3's best bf16 forward (740 TFLOP/s,
75 %, Shah et al. 2024; the rows' own, cuDNN with dropout, measure 21-29 %),
elementwise work at the whole HBM3 datasheet rate (3.35 TB/s), no host time a kernel,
links free; `room` also takes off the fp32 main-grad pass, which gradient-accumulation
fusion runs inside the weight-gradient GEMM."""


def run_config(run: PublishedRun, measured: dict[str, Any] | None = None) -> Any:
    lent = measured if measured is CEILING else \
        {k: v for k, v in (measured or {}).items() if k in MEASURED_KEYS}
    hardware = {"preset": "h100-80gb", **lent}
    return config_from_dict({
        "model": {"kind": "transformer", "num_layers": run.layers, "hidden_size": run.hidden,
                  "num_heads": run.heads, "num_kv_heads": run.heads,
                  "ffn_hidden_size": 4 * run.hidden, "vocab_size": 131072,
                  "seq_length": 4096, "micro_batch_size": run.micro_batch_size,
                  "gated_mlp": False,
                  "tie_embeddings": False, "tp": run.tp, "dp": run.dp,
                  "distributed_optimizer": True, "recompute": "selective", "dropout": True},
        "pipeline": {"pp": run.pp, "global_batch_size": run.global_batch,
                     # Megatron refuses --tp-comm-overlap at tp 1 (no sequence
                     # parallelism there): the tp-1 row ran without it.
                     "tp_comm_overlap": run.tp > 1, "overlap_grad_reduce": True,
                     "overlap_param_gather": True},
        "hardware": hardware})


@dataclass(frozen=True, kw_only=True)
class Prediction:
    iteration_ms: float
    comm_ms: float
    """The busiest rank's exposed communication (ppsim.job.exposure.exposed_comm_ms)."""
    bubble: float
    tflops_now: float
    """TFLOP/s per GPU as Megatron counts today (causal attention)."""
    tflops_2024: float
    """As Megatron counted in July 2024 (the whole s x s attention)."""


def predict(run: PublishedRun, measured: dict[str, Any] | None = None) -> Prediction:
    problem = build_problem(run_config(run, measured))
    summary = simulate(problem, record=False).summary
    ms = summary.iteration_time_ms
    arch = problem.hardware.job.arch  # type: ignore[union-attr]

    def rate(causal: bool) -> float:
        return iteration_flops(arch, run.global_batch, causal=causal) / (ms / 1e3) / run.gpus / 1e12

    return Prediction(iteration_ms=ms, comm_ms=exposed_comm_ms(problem, summary),
                      bubble=summary.bubble_fraction, tflops_now=rate(True),
                      tflops_2024=rate(False))


@dataclass(frozen=True, kw_only=True)
class Room:
    """How the published time of a row without pipeline parallelism bounds its compute."""

    floor_ms: float
    """The fastest its compute can run (CEILING's rates)."""
    room_ms: float
    """The most compute the published time leaves room for, were the data-parallel tail
    hidden as far as any overlap can: its gradient reduce-scatter and parameter gather
    (X, ppsim's link times, each whole) run only beside the last microbatch's backward
    and the first one's forward, together 1 / m of the compute C, so the step takes at
    least C (1 - 1/m) + max(C/m, X). Generous too: no last bucket, SMs or optimizer."""


def room(run: PublishedRun) -> Room:
    """The row's Room: its floor priced at CEILING (less what communication it still
    exposes and the main-grad pass), its room from the published time and the links."""
    real = build_problem(run_config(run))
    job = real.hardware.job
    assert job is not None
    whole = replace(job, overlap_grad_reduce=False, overlap_param_gather=False)
    x = whole.tail(sum(c.params for c in real.stage_costs), 0.0, 0.0, 0.0,
                   holds_embedding=True, holds_head=True).reduce_ms
    fastest = build_problem(run_config(run, CEILING))
    summary = simulate(fastest, record=False).summary
    main_grad_ms = 8.0 * sum(c.params for c in fastest.stage_costs) \
        * fastest.schedule.microbatches / (CEILING["memory_bandwidth_gbps"] * 1e6)
    floor = summary.iteration_time_ms - exposed_comm_ms(fastest, summary) - main_grad_ms
    flops = iteration_flops(job.arch, run.global_batch, causal=False) / run.gpus
    published_ms = flops / (run.tflops * 1e12) * 1e3
    m = real.schedule.microbatches
    c_max = published_ms if m == 1 else (published_ms - x) * m / (m - 1)
    return Room(floor_ms=floor, room_ms=published_ms if c_max / m > x else c_max)


def ppsim_json(argv: list[str]) -> dict[str, Any]:
    """`ppsim ARGV` (a --json command) in this process: its one object; a refusal stops
    the script with ppsim's line."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ppsim(argv)
    if code:
        raise SystemExit(f"ppsim {shlex.join(argv)}: {err.getvalue().strip()}")
    return json.loads(out.getvalue())


def plan_case(label: str, argv: list[str]) -> None:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", "plan", *argv, "--top", "3",
                          "--json"], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 3):
        print(f"{label}: exit {out.returncode}: {out.stderr.strip()}")
        return
    doc = json.loads(out.stdout)
    print(f"{label}: {wall:.1f} s whole process, {doc['evaluated']:,} of {doc['total_shapes']:,} "
          "shapes")
    for c in doc["candidates"]:
        t = c["throughput"]
        folded = f" etp{c['etp']}" if c["etp"] != c["tp"] else ""
        print(f"   tp{c['tp']} cp{c['cp']} ep{c['ep']}{folded} pp{c['pp']} dp{c['dp']} "
              f"vpp{c['vpp']} "
              f"mbs{c['micro_batch_size']}: {c['iteration_time_ms']:.0f} ms, "
              f"{t['tflops_per_gpu']:.0f} TFLOP/s/GPU, MFU {t['mfu']:.1%}, "
              f"{t['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, peak "
              f"{c['peak_memory_bytes'] / 1e9:.1f} GB, {c['held_back_by']}, "
              f"{c['data_parallel']}" + (f" x{c['dp_replicas']} copies"
                                         if c["dp_replicas"] > 1 else "")
              + (" DeepEP" if c.get("moe_token_dispatcher_type") == "flex" else "")
              + (f" cp {c['cp_comm_type']}" if c["cp"] > 1 else "")
              + (f"; policy {c['memory_policy']}" if c["memory_policy"] else ""))


def _models(runs: list[PublishedRun]) -> list[PublishedRun]:
    """The first run of each model (its kernels stand for the model's other runs)."""
    seen: dict[str, PublishedRun] = {}
    for run in runs:
        seen.setdefault(run.model, run)
    return list(seen.values())


def measure_rows(out: Path, device: str = "cuda") -> None:
    """Each model's kernels on this GPU into out/weak-<model>.toml (the target rows'
    first, each file written as soon as it is measured), every measurement in
    out/weak-measurements.json."""
    from ppsim.executor.hwprofile import hardware_toml, measure_hardware
    from ppsim.fileio import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    everything = {}
    for i, run in enumerate(_models(WEAK + HELD_OUT)):
        t0 = time.perf_counter()
        # The first model warms the device up to its settled clock; the rest keep it there.
        result = measure_hardware(device, model=run_config(run).model.arch,
                                  sustained_s=8.0 if i == 0 else 2.0)
        write_text_atomic(str(out / f"weak-{run.model}.toml"), hardware_toml(result))
        everything[run.model] = result
        write_text_atomic(str(out / "weak-measurements.json"), json.dumps(everything, indent=1))
        m = result["measurements"]
        rates = [x["tflops"] for x in m["model_matmuls"]]
        att = m["model_attention"]
        kernels = ", ".join(f"{k} {v['tflops']:.0f}" for k, v in att["kernels"].items())
        print(f"measured {run.model}: matmuls {min(rates):.0f}-{max(rates):.0f} TFLOP/s, "
              f"attention {kernels} (kept {att['kernel']}), settled "
              f"{m['settled_tflops']:.0f} ({time.perf_counter() - t0:.0f} s)", flush=True)


def table(title: str, runs: list[PublishedRun], measured: Path | None) -> None:
    label = f"kernels measured in {measured}" if measured else "the h100-80gb preset"
    mbs = {r.micro_batch_size for r in runs} - {1}
    print(f"{title}, {label}" + (f", micro-batch {mbs.pop()}" if mbs else ""))
    print(f"{'run':10} {'tp':>2} {'pp':>2} {'dp':>3} {'GPUs':>5} {'iter ms':>8} "
          f"{'comm ms':>7} {'bubble':>6} {'TFLOP/s now':>11} {'as in 2024':>10} "
          f"{'published':>9} {'error':>7} {'compute ms':>10} {'floor':>5} {'room':>5}")
    for run in runs:
        file = measured / f"weak-{run.model}.toml" if measured else None
        if file and not file.exists():
            print(f"{run.name:10} not measured ({file.name} missing)")
            continue
        hw = tomllib.loads(file.read_text())["hardware"] if file else None
        p = predict(run, hw)
        print(f"{run.name:10} {run.tp:2} {run.pp:2} {run.dp:3} {run.gpus:5} "
              f"{p.iteration_ms:8.1f} {p.comm_ms:7.1f} {p.bubble:6.1%} "
              f"{p.tflops_now:11.1f} {p.tflops_2024:10.1f} "
              f"{run.tflops:9.1f} {p.tflops_2024 / run.tflops - 1:+7.1%}" + bounds(run, p))


def bounds(run: PublishedRun, p: Prediction) -> str:
    """A row without pipeline parallelism: its compute time as ppsim prices it, the
    least any H100 could take (Room.floor_ms) and the most the published time allows
    (Room.room_ms); the room below the floor: no rate makes the published time."""
    if run.pp > 1:
        return ""
    r = room(run)
    return f" {p.iteration_ms - p.comm_ms:10.0f} {r.floor_ms:5.0f} {r.room_ms:5.0f}"


def dir_after(flag: str) -> Path | None:
    """The path given after `flag` on the command line, or None."""
    return Path(sys.argv[sys.argv.index(flag) + 1]) if flag in sys.argv else None


def main() -> None:
    measure, measured = dir_after("--measure"), dir_after("--measured")
    mbs = int(str(dir_after("--micro-batch-size") or 1))
    weak, held_out = ([replace(r, micro_batch_size=mbs) for r in runs]
                      for runs in (WEAK, HELD_OUT))
    if measure:
        measure_rows(measure)
        measured = measured or measure
    for source in [None, measured] if measured else [None]:
        table("weak scaling without pipeline parallelism (the target)", weak, source)
        table("held out: pipeline parallelism, weak and strong scaling", held_out, source)
    if "--quick" in sys.argv or measure:
        return
    plan_case("llama3.1-405b on 8,192 H100", ["--preset", "llama3.1-405b", "--hardware",
                                              "h100-80gb", "--gpus", "8192",
                                              "--global-batch-size", "2048",
                                              "--overlap-grad-reduce", "--overlap-param-gather",
                                              "--tp-comm-overlap"])
    plan_case("llama3.1-405b on 8,192 H100, memory policy searched",
              ["--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--gpus", "8192",
               "--global-batch-size", "2048", "--overlap-grad-reduce",
               "--overlap-param-gather", "--tp-comm-overlap", "--search", "policy"])
    deepseek = ["--preset", "deepseek-v3", "--hardware", "h100-80gb", "--gpus", "2048",
                "--global-batch-size", "15360", "--overlap-grad-reduce",
                "--overlap-param-gather"]
    plan_case("deepseek-v3 on 2,048 H100", deepseek)
    plan_case("deepseek-v3 on 2,048 H100, context-parallel traffic searched",
              [*deepseek, "--search", "cp-comm"])


if __name__ == "__main__":
    main()
