"""torchtitan's published 1-D to 4-D runs (FSDP, TP, PP, CP), held out (nothing fitted).

benchmarks/llama3_h100_202412_torchtitan.md of pytorch/torchtitan (torch 1963fc8, torchao
eab345c, torchtitan 9dec370, December 2024; H100 with 96 GB of HBM2e at 500 W, 400 Gb/s a
GPU across hosts), every run with torch.compile and torchao's Float8 (tensorwise dynamic
scales; the float8 launch torchtitan's docs/float8.md gives, which gathers FSDP's weights
in FP8: `--fp8-recipe tensorwise --fp8-param-gather` here):

- Tables 1 and 3: Llama 3.1 8B, FSDP over 8 and 128 GPUs, local batch 2 x 8192,
  selective checkpointing: the Float8 row against the compiled bf16 row (FP8's speed-up);
- Table 4: Llama 3.1 70B on 256 GPUs, FSDP 32 x TP 8, local batch 16, full
  checkpointing: with and without AsyncTP (`--tp-comm-overlap` here);
- Table 5: Llama 3.1 405B on 512 GPUs, FSDP 8 x TP 8 x PP 8, local batch 32 in 8
  microbatches (torchtitan's default count, the pp degree), full checkpointing, AsyncTP:
  1F1B and interleaved 1F1B over the splits torchtitan generated (generate_split_points:
  15, 16 x 6, 15 layers; 16 stages of 7, 8 x 14, 7).

The devices ran below the `h100-80gb` preset (500 W, HBM2e at 2.4 TB/s, a peak between the
SXM's and the NVL's, as the document says), which ppsim does not price, so the absolute
tokens/s per GPU are shown but the check is each table's ratio, in which the device's rate
cancels: FP8 over bf16, AsyncTP over none, interleaved over 1F1B. Peaks beside
torchtitan's logged memory (max_reserved_gib: the allocator's reserve, above what the
tensors take). torchtitan's selective checkpointing is priced as itself (`--recompute op-
sac`); ppsim prices neither torch.compile's fusions nor its own memory. Tables 2 and 6,
context parallelism at 32,768 to 262,144 tokens (8B on 8 GPUs, FSDP x CP = 8, local batch
1; the 405B 3-D job of Table 5 with 8 microbatches of 1, FSDP x CP = 8; full
checkpointing, Float8): each row over the CP 1 row (a longer sequence, so fewer tokens/s),
priced with `--cp-comm-type all_gather` (torchtitan rotated K/V by all-gather; Transformer
Engine's exposes it, torch's hides part behind the local chunk).

Then benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (June 2025, the same machines):
Llama 3.1 70B on 256 GPUs (FSDP 32 x TP 8, local batch 16, full checkpointing) and 8B on
64 (FSDP 8 x TP 8, local batch 12, per-op selective checkpointing), each in bf16, Float8
tensorwise and rowwise, with vanilla TP and AsyncTP: FP8's speed-up over bf16 and
AsyncTP's over vanilla TP. The document itself calls its rowwise vanilla-TP baseline low
(pytorch/torchtitan issue 1207).

Run: .venv/bin/python benchmarks/bench_torchtitan.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

GIB = 2 ** 30
FLOAT8 = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param_gather": True}
ROWWISE = {"fp8": "hybrid", "fp8_recipe": "rowwise"}


@dataclass(frozen=True, kw_only=True)
class TitanRun:
    """One published row and the job it ran."""

    label: str
    preset: str
    dp: int
    tp: int = 1
    pp: int = 1
    mbs: int
    microbatches: int = 1
    recompute: str
    model: dict[str, Any] = field(default_factory=dict)
    pipeline: dict[str, Any] = field(default_factory=dict)
    tokens_per_gpu: float
    """Published TPS/GPU."""
    memory_gib: float
    """Published memory (max reserved across GPUs)."""


@dataclass(frozen=True, kw_only=True)
class Predicted:
    tokens_per_gpu: float
    peak_gib: float


def predict(run: TitanRun) -> Predicted:
    cfg = config_from_dict({
        "model": {"preset": run.preset, "tp": run.tp, "dp": run.dp, "fsdp": True,
                  "micro_batch_size": run.mbs, "recompute": run.recompute, **run.model},
        "pipeline": {"pp": run.pp, "microbatches": run.microbatches, **run.pipeline},
        "hardware": {"preset": "h100-80gb", "memory_bytes": 96 * GIB}})
    problem = build_problem(cfg)
    summary = simulate(problem, record=False).summary
    job = problem.hardware.job
    assert job is not None
    rate = job.throughput(summary.iteration_time_ms)
    assert rate is not None
    return Predicted(tokens_per_gpu=rate.tokens_per_s_per_gpu,
                     peak_gib=max(r.peak_memory_bytes for r in summary.ranks) / GIB)


def _8b(gpus: int, fp8: bool, tps: float, mem: float) -> TitanRun:
    return TitanRun(label=f"8B FSDP {gpus}" + (" Float8" if fp8 else " bf16"),
                    preset="llama3-8b", dp=gpus, mbs=2, recompute="op-sac",
                    model=FLOAT8 if fp8 else {}, tokens_per_gpu=tps, memory_gib=mem)


def _70b(async_tp: bool, tps: float, mem: float) -> TitanRun:
    return TitanRun(label="70B 2D" + (" + AsyncTP" if async_tp else ""), preset="llama3-70b",
                    dp=32, tp=8, mbs=16, recompute="full", model=FLOAT8,
                    pipeline={"tp_comm_overlap": async_tp}, tokens_per_gpu=tps, memory_gib=mem)


def _cp_rows(big: bool) -> list[tuple[str, TitanRun, TitanRun]]:
    """Tables 2 (8B) and 6 (405B): each CP size's row over CP 1's."""
    published = (76, 47, 31, 16) if big else (3890, 2540, 1071, 548)
    runs = []
    for i, tps in enumerate(published):
        cp = 2 ** i
        model = {**FLOAT8, "cp": cp, "seq_length": 32768 * cp, "cp_comm_type": "all_gather"}
        pipe = {"tp_comm_overlap": True, "split": [15, *[16] * 6, 15]} if big else {}
        runs.append(TitanRun(label=f"{'405B 3D' if big else '8B FSDP'} CP {cp}",
                             preset="llama3.1-405b" if big else "llama3-8b", dp=8 // cp,
                             tp=8 if big else 1, pp=8 if big else 1, mbs=1,
                             microbatches=8 if big else 1, recompute="full", model=model,
                             pipeline=pipe, tokens_per_gpu=tps, memory_gib=0.0))
    table = "6" if big else "2"
    return [(f"Table {table}: CP {r.model['cp']} over CP 1", runs[0], r) for r in runs[1:]]


def _405b(interleaved: bool, tps: float, mem: float) -> TitanRun:
    split = [7, *[8] * 14, 7] if interleaved else [15, *[16] * 6, 15]
    sched = {"schedule": "interleaved-1f1b", "vpp": 2} if interleaved else {"schedule": "1f1b"}
    return TitanRun(label="405B 3D " + ("interleaved 1F1B" if interleaved else "1F1B"),
                    preset="llama3.1-405b", dp=8, tp=8, pp=8, mbs=4, microbatches=8,
                    recompute="full", model=FLOAT8,
                    pipeline={"tp_comm_overlap": True, "split": split, **sched},
                    tokens_per_gpu=tps, memory_gib=mem)


def _size(preset: str) -> str:
    return preset.split("-")[1].upper()


def _2d(preset: str, quant: str, async_tp: bool, tps: float) -> TitanRun:
    """A row of the June 2025 AsyncTP tables."""
    big = preset == "llama3-70b"
    model = {"bf16": {}, "tensorwise": FLOAT8, "rowwise": ROWWISE}[quant]
    return TitanRun(label=f"{_size(preset)} TP 8 {quant}" + (" AsyncTP" if async_tp else ""),
                    preset=preset, dp=32 if big else 8, tp=8, mbs=16 if big else 12,
                    recompute="full" if big else "op-sac", model=model,
                    pipeline={"tp_comm_overlap": async_tp}, tokens_per_gpu=tps,
                    memory_gib=0.0)


JUNE_2025 = {("llama3-70b", "bf16"): (597.3, 652.4), ("llama3-70b", "tensorwise"): (809.8, 942.4),
             ("llama3-70b", "rowwise"): (599.6, 624.8), ("llama3-8b", "bf16"): (4378, 4809.4),
             ("llama3-8b", "tensorwise"): (5078.1, 5570.1),
             ("llama3-8b", "rowwise"): (3708.5, 3914.9)}
"""Published tokens/s per GPU, vanilla TP and AsyncTP."""


def _june_pairs() -> list[tuple[str, TitanRun, TitanRun]]:
    runs = {(m, q, a): _2d(m, q, a, tps[a]) for (m, q), tps in JUNE_2025.items()
            for a in (False, True)}
    pairs = [(f"June: {_size(m)} AsyncTP, {q}", runs[m, q, False], runs[m, q, True])
             for m, q in JUNE_2025]
    pairs += [(f"June: {_size(m)} {q} over bf16", runs[m, "bf16", False], runs[m, q, False])
              for m, q in JUNE_2025 if q != "bf16"]
    return pairs


PAIRS = [  # (base, variant): the ratio variant / base is the check
    ("Table 1: Float8 over bf16", _8b(8, False, 6667, 77.0), _8b(8, True, 8532, 76.8)),
    ("Table 3: Float8 over bf16", _8b(128, False, 6514, 62.0), _8b(128, True, 8380, 61.8)),
    ("Table 4: AsyncTP over none", _70b(False, 829, 71.9), _70b(True, 876, 67.6)),
    ("Table 5: interleaved over 1F1B", _405b(False, 100, 82.5), _405b(True, 128, 72.7)),
]


def main() -> None:
    print("torchtitan's published runs (Dec 2024, June 2025; 500 W H100 96 GB), priced on "
          "h100-80gb")
    print(f"{'run':28} {'tok/s/GPU':>9} {'published':>9} {'peak GiB':>8} {'published':>9}")
    ratios, shown = [], set()
    for title, base, variant in PAIRS + _cp_rows(False) + _cp_rows(True) + _june_pairs():
        ours = [predict(r) for r in (base, variant)]
        for r, p in zip((base, variant), ours, strict=True):
            if r.label not in shown:
                shown.add(r.label)
                memory = f"{r.memory_gib:9.1f}" if r.memory_gib else ""
                print(f"{r.label:28} {p.tokens_per_gpu:9,.0f} {r.tokens_per_gpu:9,.0f} "
                      f"{p.peak_gib:8.1f} {memory}")
        predicted = ours[1].tokens_per_gpu / ours[0].tokens_per_gpu
        published = variant.tokens_per_gpu / base.tokens_per_gpu
        ratios.append((title, predicted, published))
    print("\nratio (the check)                   ppsim  published  error")
    for title, predicted, published in ratios:
        print(f"{title:34} {predicted:6.3f} {published:10.3f} {predicted / published - 1:+6.1%}")


if __name__ == "__main__":
    main()
