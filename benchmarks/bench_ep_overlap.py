"""Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm) against published H100
runs, held out: nothing is fitted to them.

yanring/Megatron-MoE-ModelZoo, best_practice/Qwen3/readme.md (Qwen3-235B-A22B, 256 H100,
NVLink 4, InfiniBand 8 x 50 GB/s, sequence 4096, bf16, recompute "norm, act":
--recompute-modules layernorm moe_act; best-practice/qwen3/run_235b.sh adds
--moe-router-force-load-balancing): step time and TFLOP/s per GPU of each row. The two
cross-node rows ran the DeepEP dispatcher (`--moe-token-dispatcher-type flex`: a token
crosses to each node once and is forwarded over NVLink), without and with "1f1b
overlap"; best_practice/qwen3/run_h100_235b.sh gives 320 TFLOP/s/GPU for the overlapped
job on a later Megatron (with CUDA graphs, not priced); the last row ran Megatron's
all-to-all dispatcher. The repository's
sbatch_benchmarking.sh adds --tp-comm-overlap to bf16 runs and --overlap-moe-expert-
parallel-comm --delay-wgrad-compute for "1f1b overlap". Each is priced on the h100-80gb
preset with those and the distributed optimizer's overlaps, the DeepEP rows also as if
they had run the all-to-all.

Then (without --quick) `ppsim plan --gpus 256` for the same job with the flag, and with the
dispatcher searched (`--search dispatcher`: the all-to-all or DeepEP per shape).

With --measure DIR (on a GPU: `bash benchmarks/gpu_checks.sh ep`) the model's own kernels
at tp 2 ep 32 (its experts' grouped matmuls at the tokens each rank's experts get) are
measured after a warm-up to the settled clock into DIR/qwen3-235b.toml; with --measured
DIR the rows are priced again with those matmul and attention rates on the H100 preset.
Once the all-to-alls hide, the overlapped rows are bound by exactly these kernels.

Run: .venv/bin/python benchmarks/bench_ep_overlap.py [--quick] [--measure DIR]
     [--measured DIR]
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bench_job import MEASURED_KEYS, dir_after, plan_case

from ppsim.cli.main import main as ppsim
from ppsim.config.schema import config_from_dict
from ppsim.fileio import write_text_atomic

COMMON = ["--preset", "qwen3-235b-a22b", "--hardware", "h100-80gb", "--gpus", "256",
          "--global-batch-size", "2048", "--micro-batch-size", "1", "--seq-length", "4096",
          "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
          "--tp-comm-overlap", "--recompute-granularity", "selective", "--recompute-modules",
          "layernorm", "moe_act", "--moe-grouped-gemm", "--etp", "1"]
OVERLAP = "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"


@dataclass(frozen=True, kw_only=True)
class Row:
    name: str
    shape: str
    """The row's sizes as ppsim's flags."""
    tflops: float
    """Published TFLOP/s per GPU."""
    step_s: float = 0.0
    """Published step time; 0: not published."""


FLEX = "--moe-token-dispatcher-type flex"
ROWS = [
    Row(name="DeepEP, EP across nodes", shape=f"--tp 2 --pp 8 --vpp 4 --ep 32 {FLEX}",
        step_s=19.7, tflops=245),
    Row(name="  + 1f1b overlap", shape=f"--tp 2 --pp 8 --vpp 4 --ep 32 {FLEX} {OVERLAP}",
        step_s=17.6, tflops=276),
    # best_practice/qwen3/run_h100_235b.sh, "H100 config, 320 TFLOPS": the same job on a
    # later Megatron, with CUDA graphs of the router and the dispatcher's preprocessing.
    Row(name="  + later, CUDA graphs", shape=f"--tp 2 --pp 8 --vpp 4 --ep 32 {FLEX} {OVERLAP}",
        tflops=320),
    Row(name="A2A, EP in a node", shape="--tp 2 --pp 32 --vpp 3 --ep 8", step_s=24.2,
        tflops=200),
]


MEASURED_FILE = "qwen3-235b.toml"


def price(shape: str, hardware: Path | None = None) -> dict:
    """simulate --json of a row; `hardware`: a config whose [hardware] replaces the
    preset's."""
    flags = [*COMMON, *shape.split()]
    if hardware is not None:
        at = flags.index("--hardware")
        flags[at:at + 2] = ["--config", str(hardware)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ppsim(["simulate", *flags, "--json"]) == 0, shape
    return json.loads(out.getvalue())


def measure(out: Path) -> None:
    """The model's kernels at the rows' tp 2 ep 32 on this GPU into out/MEASURED_FILE."""
    from ppsim.executor.hwprofile import hardware_toml, measure_hardware

    out.mkdir(parents=True, exist_ok=True)
    arch = config_from_dict({"model": {"preset": "qwen3-235b-a22b", "tp": 2, "ep": 32,
                                       "etp": 1, "dp": 16}}).model.arch
    result = measure_hardware("cuda", model=arch, sustained_s=8.0)
    write_text_atomic(str(out / MEASURED_FILE), hardware_toml(result))
    rates = [x["tflops"] for x in result["measurements"]["model_matmuls"]]
    print(f"measured: matmuls {min(rates):.0f}-{max(rates):.0f} TFLOP/s into "
          f"{out / MEASURED_FILE}", flush=True)


def measured_config(directory: Path, into: Path) -> Path:
    """A config of the H100 preset with the measured compute rates (MEASURED_KEYS)."""
    hw = tomllib.loads((directory / MEASURED_FILE).read_text())["hardware"]
    lines = ['[model]', 'preset = "qwen3-235b-a22b"', '[hardware]', 'preset = "h100-80gb"']
    lines += [f"{k} = {json.dumps(hw[k])}" for k in MEASURED_KEYS if k in hw]
    path = into / "measured.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    to_measure, measured = dir_after("--measure"), dir_after("--measured")
    if to_measure:
        measure(to_measure)
        measured = measured or to_measure
    with tempfile.TemporaryDirectory() as tmp:
        table(None, "the h100-80gb preset")
        if measured:
            table(measured_config(measured, Path(tmp)), f"kernels measured in {measured}")
    if "--quick" in sys.argv or to_measure:
        return
    plan_case("qwen3-235b-a22b on 256 H100, DeepEP, combined 1F1B",
              [*COMMON[:8], *COMMON[12:16], *FLEX.split(), *OVERLAP.split()])
    plan_case("qwen3-235b-a22b on 256 H100, combined 1F1B, the dispatcher searched",
              [*COMMON[:8], *COMMON[12:16], *OVERLAP.split(), "--search", "dispatcher"])


def table(hardware: Path | None, source: str) -> None:
    print(f"Megatron-MoE-ModelZoo, Qwen3-235B-A22B on 256 H100 (held out); {source};")
    print("error: ppsim's TFLOP/s per GPU over the published (+: ppsim faster)")
    print(f"{'row':24} {'TFLOP/s':>7} {'ppsim':>6} {'error':>7} {'step s':>6} {'ppsim s':>8} "
          f"{'peak GB':>7} {'as all-to-all s':>15}")
    for row in ROWS:
        sim = price(row.shape, hardware)
        t = sim["iteration_time_ms"] / 1e3
        tf = sim["throughput"]["tflops_per_gpu"]
        peak = max(r["peak_memory_bytes"] for r in sim["ranks"]) / 1e9
        a2a = (f"{price(row.shape.replace(FLEX, ''), hardware)['iteration_time_ms'] / 1e3:15.2f}"
               if FLEX in row.shape else "")
        step = f"{row.step_s:6.1f}" if row.step_s else f"{'-':>6}"
        print(f"{row.name:24} {row.tflops:7.0f} {tf:6.0f} {tf / row.tflops - 1:+7.1%} {step} "
              f"{t:8.2f} {peak:7.1f} {a2a}")


if __name__ == "__main__":
    main()
