"""Megatron-LM's own CI jobs (tests/functional_tests/test_cases/*/model_config.yaml) fed
to `ppsim simulate`, as benchmarks/check_megatron_lines.py feeds them: what those lines
hold that ppsim read wrongly or refused wrongly."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import run_cli

# gpt3_mcore_te_tp2_pp2 (a CI job's model and parallel arguments, and --vocab-size,
# which the job reads from its GPT-2 vocabulary file).
CI_LINE = shlex.split(
    "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
    "--global-batch-size 32 --seq-length 1024 --max-position-embeddings 1024 "
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16 "
    "--vocab-size 50257 --transformer-impl transformer_engine --hardware h100-80gb "
    "--gpus 8")


def _json(argv: list[str]) -> dict:
    ran = run_cli(["simulate", *argv, "--json"])
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


@pytest.mark.parametrize("extra", [
    ["--check-weight-hash-across-dp-replicas-interval", "10"],
    ["--async-ckpt-use-cpu-shm"],
    ["--ckpt-fully-parallel-load-per-rank-objects"],
    ["--error-injection-rate", "100", "--error-injection-type", "persistent_error"],
    ["--test-mode"],
    ["--sft-tokenizer-prompt-format", "identity"],
    ["--moe-routing-trace-path", "/tmp/trace"],
])
def test_ci_jobs_run_arguments_are_taken_and_change_nothing(extra: list[str]) -> None:
    """Checks, fault injection, checkpoint and tokenizer switches of CI jobs were
    "unrecognized arguments": the whole job refused for a weight-hash check every 10
    iterations."""
    assert _json([*CI_LINE, *extra]) == _json(CI_LINE)


def test_the_layer_wise_param_layout_switch_is_named_not_priced() -> None:
    ran = run_cli(["simulate", *CI_LINE, "--no-use-layer-wise-param-layout", "--json"])
    assert ran.returncode == 0 and json.loads(ran.stdout) == _json(CI_LINE)
    assert "--no-use-layer-wise-param-layout taken, not priced" in ran.stderr


def test_one_mtp_layer_repeated_is_refused_naming_what_ppsim_prices() -> None:
    """It was refused as unknown, with "did you mean --mtp-num-layers?"."""
    ran = run_cli(["simulate", *CI_LINE, "--mtp-num-layers", "2", "--mtp-use-repeated-layer"])
    errors = [line for line in ran.stderr.splitlines() if "error" in line]
    assert ran.returncode == 2 and len(errors) == 1 and "Traceback" not in ran.stderr
    assert "error: --mtp-use-repeated-layer: shares one MTP layer's weights across the 2 " \
        "depths" in errors[0]
    assert "did you mean" not in ran.stderr


@pytest.mark.parametrize("argv", [[*CI_LINE, "--mtp-num-layers", "1", "--position-embedding-type",
                                   "rope"],
                                  ["--preset", "deepseek-v3", "--hardware", "h100-80gb"],
                                  CI_LINE])
def test_one_mtp_depth_repeated_is_the_one_layer_and_prices_the_same(argv: list[str]) -> None:
    """At one MTP depth (or none) the repeated layer is the only one: the same job. It was
    refused as at two."""
    assert _json([*argv, "--mtp-use-repeated-layer"]) == _json(argv)


def _peak(argv: list[str]) -> int:
    return max(r["peak_memory_bytes"] for r in _json(argv)["ranks"])


@pytest.mark.parametrize("given", ["--hidden-dropout", "--attention-dropout"])
def test_one_dropout_given_leaves_the_other_at_megatrons_default(given: str) -> None:
    """`--hidden-dropout 0` alone leaves Megatron's attention dropout at 0.1 (and the other
    way round): the model still drops out. It was priced with no dropout at all."""
    none = _peak([*CI_LINE, "--hidden-dropout", "0", "--attention-dropout", "0"])
    default = _peak(CI_LINE)
    assert default > none
    assert _peak([*CI_LINE, given, "0"]) == default


def test_one_dropout_given_over_a_preset_without_dropout_keeps_it_off() -> None:
    base = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "8"]
    assert _peak([*base, "--hidden-dropout", "0"]) == _peak(base)
    assert _peak([*base, "--hidden-dropout", "0.1"]) > _peak(base)


MOE_LINE = shlex.split("--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 "
                       "--expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall "
                       "--sequence-parallel --disable-bias-linear")
"""gpt3_moe_mcore_te_tp4_ep2_etp2_pp2's experts over CI_LINE (its shared expert apart)."""


def _priced(argv: list[str]) -> tuple[float, int, float]:
    """(iteration time, the highest peak, the FLOPs the throughput counts an iteration)."""
    sim = _json(argv)
    time = sim["iteration_time_ms"]
    return (time, max(r["peak_memory_bytes"] for r in sim["ranks"]),
            sim["throughput"]["tflops_per_gpu"] * time)


def test_a_shared_expert_narrower_than_an_expert_is_priced_at_its_width() -> None:
    """Several CI jobs give a 512-wide shared expert beside 1024-wide experts: Megatron
    builds one 512-wide MLP; ppsim refused the line ("prices shared experts as whole
    experts"). Its time, peak and FLOPs lie between none and one whole expert's."""
    width = lambda n: [*CI_LINE, *MOE_LINE, "--moe-shared-expert-intermediate-size", n]  # noqa: E731
    none, half, whole = _priced([*CI_LINE, *MOE_LINE]), _priced(width("512")), \
        _priced(width("1024"))
    for lo, mid, hi in zip(none, half, whole, strict=True):
        assert lo < mid < hi


def test_a_job_search_holds_the_chunks_layers_per_virtual_stage_give_over_a_held_pp() -> None:
    """CI's interleaved jobs give --pipeline-model-parallel-size 4 and
    --num-layers-per-virtual-pipeline-stage 1: `plan --gpus` refused them ("the job search
    varies pp") though pp was held, and with it the chunks a rank makes."""
    ran = run_cli(["plan", *CI_LINE[:CI_LINE.index("--tensor-model-parallel-size")],
                   "--pipeline-model-parallel-size", "4",
                   "--num-layers-per-virtual-pipeline-stage", "1", "--bf16",
                   "--vocab-size", "50257", "--hardware", "h100-80gb", "--gpus", "8",
                   "--time-budget", "5", "--json"])
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["held"] == {"pp": 4, "micro_batch_size": 4, "vpp": 3}
    refused = run_cli(["plan", *CI_LINE[:CI_LINE.index("--tensor-model-parallel-size")],
                       "--num-layers-per-virtual-pipeline-stage", "1", "--vocab-size",
                       "50257", "--hardware", "h100-80gb", "--gpus", "8"])
    assert refused.returncode == 2
    assert "--num-layers-per-virtual-pipeline-stage: the job search varies pp" in refused.stderr
