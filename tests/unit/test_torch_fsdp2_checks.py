"""Megatron's --use-torch-fsdp2 as Megatron's arguments.py checks it: what it refuses (pipeline
and expert parallelism, FP8, the distributed optimizer, gradient-accumulation fusion, tied
embeddings, CPU offload), and its launch line read back."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli


@pytest.mark.parametrize(("extra", "field", "words"), [
    (["--pp", "2"], "model.fsdp_framework", "not supported with pipeline parallelism"),
    (["--fp8-format", "hybrid"], "model.fp8", "Transformer Engine's"),
    (["--use-distributed-optimizer"], "model.fsdp", "FSDP already shards"),
])
def test_megatrons_torch_fsdp2_checks(extra: list[str], field: str, words: str) -> None:
    ran = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus",
                   "8", "--pp", "1", "--use-torch-fsdp2", "--no-gradient-accumulation-fusion",
                   *extra])
    assert ran.returncode == 2 and f"{field}" in ran.stderr and words in ran.stderr


def test_megatrons_torch_fsdp2_refuses_tied_embeddings() -> None:
    """arguments.py: "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights";
    GPT-3 ties its head to the table, and its line without the flag is refused, with it
    priced."""
    line = ["simulate", "--preset", "gpt3-1.3b", "--hardware", "h100-80gb", "--gpus", "8",
            "--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
    ran = run_cli(line)
    assert ran.returncode == 2 and len(ran.stderr.splitlines()) == 1
    assert "model.tie_embeddings: --use-torch-fsdp2 requires --untie-embeddings-and-output-" \
        "weights" in ran.stderr
    assert run_cli([*line, "--untie-embeddings-and-output-weights"]).returncode == 0


def test_megatrons_torch_fsdp2_refuses_gradient_accumulation_fusion() -> None:
    """Megatron asserts "--use-torch-fsdp2 is not supported with gradient accumulation
    fusion", which is on unless the line turns it off; ppsim planned such a line and
    printed it without --no-gradient-accumulation-fusion."""
    ran = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus",
                   "8", "--use-torch-fsdp2"])
    assert ran.returncode == 2 and len(ran.stderr.splitlines()) == 1
    assert "model.gradient_accumulation_fusion: --use-torch-fsdp2 is not supported with " \
        "gradient accumulation fusion" in ran.stderr
    assert "add --no-gradient-accumulation-fusion" in ran.stderr


def test_megatrons_torch_fsdp2_launch_line_reads_back() -> None:
    base = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16",
            "--global-batch-size", "32", "--pp", "1"]
    ran = run_cli(["plan", *base, "--use-torch-fsdp2", "--no-gradient-accumulation-fusion",
                   "--top", "1", "--json"])
    assert ran.returncode == 0, ran.stderr
    best = json.loads(ran.stdout)["best"]
    assert best["torchtitan_job"] is None and "--use-torch-fsdp2" in best["megatron_job_flags"]
    assert "--no-gradient-accumulation-fusion" in best["megatron_job_flags"]
    again = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus",
                     "16", *best["megatron_job_flags"].split(), "--json"])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["iteration_time_ms"] == pytest.approx(
        best["iteration_time_ms"])


def test_megatrons_torch_fsdp2_has_no_cpu_offload() -> None:
    """torchtitan's CPU offload is not Megatron's --use-torch-fsdp2's to take."""
    base = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
            "--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
    ran = run_cli(["simulate", *base, "--gpus", "8", "--fsdp-cpu-offload"])
    assert ran.returncode == 2 and "model.fsdp_cpu_offload: is torchtitan's" in ran.stderr
    ran = run_cli(["plan", *base, "--dp", "8", "--microbatches", "2", "--search",
                   "host-optimizer"])
    assert ran.returncode == 2 and "offers no CPU offload" in ran.stderr


def test_megatrons_torch_fsdp2_takes_overlap_grad_reduce_as_megatron_does() -> None:
    """Megatron takes --overlap-grad-reduce beside --use-torch-fsdp2 (FSDP2 overlaps its
    reduce-scatters anyway): the same job, the same time. ppsim refused the line as
    Megatron DDP's knob."""
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16",
            "--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--global-batch-size",
            "64", "--json"]
    plain, overlapped = run_cli(base), run_cli([*base, "--overlap-grad-reduce"])
    assert plain.returncode == overlapped.returncode == 0, overlapped.stderr
    assert json.loads(overlapped.stdout)["iteration_time_ms"] == \
        json.loads(plain.stdout)["iteration_time_ms"]
