"""`ppsim plan --gpus` prints the best shape as a DeepSpeed pipeline job: the ds_config
keys and PipelineModule's arguments, which `--deepspeed-config` reads back to the same
simulated job; a shape DeepSpeed's engine cannot run is n/a with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

H100 = ["--hardware", "h100-80gb"]
BASE = ["--preset", "llama3-8b", *H100, "--gpus", "16", "--global-batch-size", "32",
        "--cp", "1", "--micro-batch-size", "1", "--vpp", "1", "--time-budget", "1"]


def _json(argv: list[str]) -> dict:
    r = run_cli([*argv, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _counts(bounds: list[int]) -> list[int]:
    """The layers of each stage from PipelineModule's parts over [embedding, layers...,
    head]."""
    counts = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    return [counts[0] - 1, *counts[1:-1], counts[-1] - 1]


SHAPES = {
    "bf16-optimizer": ["--pp", "4", "--tp", "1", "--bf16", "--use-distributed-optimizer",
                       "--recompute", "full"],
    "zero1": ["--pp", "4", "--tp", "1", "--bf16", "--use-distributed-optimizer",
              "--grad-reduce-in-bf16", "--recompute", "full"],
    "tp-parameters": ["--pp", "2", "--tp", "2", "--bf16", "--use-distributed-optimizer",
                      "--recompute", "none"],
    "fp16-ddp": ["--pp", "4", "--tp", "1", "--fp16", "--recompute", "full"],
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_printed_deepspeed_config_simulates_the_planned_job(shape: list[str],
                                                                tmp_path: Path) -> None:
    best = _json(["plan", *BASE, *shape])["best"]
    ds = best["deepspeed_job"]
    assert ds["notes"] == []
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(ds["config"]))
    module = ds["pipeline_module"]
    split = (["--partition-method", module["partition_method"]]
             if "partition_method" in module else
             ["--split", ",".join(map(str, _counts(module["boundaries"])))])
    tp = ["--tp", str(best["tp"])]
    if ds["megatron_deepspeed_args"]:
        assert ds["megatron_deepspeed_args"].startswith(
            f"--tensor-model-parallel-size {best['tp']}")
    sim = _json(["simulate", "--preset", "llama3-8b", *H100, "--deepspeed-config", str(path),
                 "--pp", str(module["num_stages"]), "--dp", str(best["dp"]), *tp, *split])
    assert sim["split"] == best["split"]
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"])
    assert max(r["peak_memory_bytes"] for r in sim["ranks"]) == pytest.approx(
        best["peak_memory_bytes"])


def test_the_zero_stage_is_the_one_the_optimizer_reads_back_as() -> None:
    """DeepSpeed's BF16_Optimizer (stage 0) keeps fp32 gradients; ZeRO-1 the bf16 ones."""
    stages = {name: _json(["plan", *BASE, *SHAPES[name]])["best"]["deepspeed_job"]
              ["config"]["zero_optimization"]["stage"] for name in ("bf16-optimizer", "zero1")}
    assert stages == {"bf16-optimizer": 0, "zero1": 1}


def test_the_text_names_the_config_and_the_module() -> None:
    r = run_cli(["plan", *BASE, *SHAPES["tp-parameters"]])
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("DeepSpeed (16 GPUs): "))
    assert '"train_micro_batch_size_per_gpu": 1' in line
    assert "PipelineModule(num_stages=2, partition_method='parameters')" in line
    assert line.endswith("Megatron-DeepSpeed: --tensor-model-parallel-size 2 "
                         "--sequence-parallel")


@pytest.mark.parametrize(("shape", "why"), [
    (["--pp", "4", "--tp", "1", "--bf16", "--use-distributed-optimizer", "--recompute",
      "selective"], "not this memory policy"),
    (["--pp", "2", "--vpp", "2", "--tp", "1", "--bf16", "--use-distributed-optimizer",
      "--recompute", "full"], "one stage a rank, not vpp 2"),
    (["--pp", "2", "--tp", "1", "--bf16", "--recompute", "full"], "no ZeRO stage"),
    (["--pp", "2", "--tp", "1", "--fsdp", "--recompute", "full"], "FSDP (ZeRO-3)"),
    (["--pp", "2", "--tp", "1", "--bf16", "--use-distributed-optimizer", "--recompute",
      "full", "--overlap-grad-reduce"], "--overlap-grad-reduce"),
    (["--pp", "2", "--tp", "1", "--bf16", "--use-distributed-optimizer", "--recompute",
      "full", "--mtp-num-layers", "1"], "no multi-token prediction"),
    (["--preset", "nemotron-h-8b", "--pp", "2", "--tp", "1", "--bf16",
      "--use-distributed-optimizer", "--recompute", "full"], "no Mamba"),
], ids=["selective", "vpp", "bf16-ddp", "fsdp", "overlap", "mtp", "hybrid"])
def test_a_shape_deepspeed_cannot_run_is_n_a_with_the_reason(shape: list[str],
                                                             why: str) -> None:
    best = _json(["plan", *BASE, *shape])["best"]
    ds = best["deepspeed_job"]
    assert ds["config"] is None and ds["pipeline_module"] is None
    assert any(why in note for note in ds["notes"]), ds["notes"]
    r = run_cli(["plan", *BASE, *shape])
    assert r.returncode == 0, r.stderr
    assert f"DeepSpeed (16 GPUs): n/a ({ds['notes'][0]}" in " ".join(r.stdout.split())
