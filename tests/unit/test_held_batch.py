"""`ppsim plan --gpus N` with held sizes that fix dp, and a global batch mbs x dp does
not divide: refused in Megatron's own words (ConstantNumMicroBatches'), as `simulate`
refuses the same shape, not with the search's generic "no shape" line."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main

MEGATRON = "global batch size (100) is not divisible by micro batch size"


@pytest.mark.parametrize("held,mbs,dp", [
    (["--tp", "2", "--pp", "4", "--cp", "1"], 1, 12),
    (["--dp", "12"], 1, 12),
    (["--tp", "2", "--pp", "4", "--cp", "1", "--micro-batch-size", "2"], 2, 12),
])
def test_held_sizes_that_fix_dp_refuse_the_batch_as_megatron(held: list[str], mbs: int,
                                                             dp: int, capsys) -> None:
    args = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "96",
            "--global-batch-size", "100", *held]
    rc = main(["plan", *args, "--time-budget", "5"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{MEGATRON} ({mbs}) times data parallel size ({dp})" in err
    assert f"use a multiple of {mbs * dp}" in err


def test_held_sizes_that_leave_dp_free_keep_the_search_line(capsys) -> None:
    # mbs 3 divides no batch of 1,000, but dp is still searched: no one shape to name
    rc = main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "96",
               "--global-batch-size", "1000", "--micro-batch-size", "3"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "no shape of 96 GPUs" in err and "has mbs 3" in err


def test_plan_and_simulate_refuse_the_same_shape_alike(capsys) -> None:
    args = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "96",
            "--global-batch-size", "100", "--tp", "2", "--pp", "4"]
    assert main(["simulate", *args]) == 2
    simulated = capsys.readouterr().err.strip().split("error: ", 1)[1]
    assert main(["plan", *args, "--cp", "1"]) == 2
    assert capsys.readouterr().err.strip().split("error: ", 1)[1] == simulated
