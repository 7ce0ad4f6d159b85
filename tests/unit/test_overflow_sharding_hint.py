"""When the weights, gradients and optimizer states alone overflow every shape, the
hint names `--search sharding` where sharding them over the data-parallel ranks could
fit (97 GPUs, a prime: no tensor or pipeline split of Llama 3 8B, only dp 97), and not
where it could not (one GPU)."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main

HINT = "--search sharding"


def _plan(capsys, *flags: str) -> tuple[int, str]:
    rc = main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb",
               "--time-budget", "10", *flags])
    return rc, " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flags", [
    ("--gpus", "97", "--global-batch-size", "97"),
    ("--gpus", "96", "--global-batch-size", "96", "--tp", "1", "--pp", "1", "--cp", "1"),
])
def test_state_that_sharding_would_fit_names_the_sharding_search(flags, capsys) -> None:
    rc, out = _plan(capsys, *flags)
    assert rc == 3 and "alone overflow 80.00 GB" in out and HINT in out
    rc, out = _plan(capsys, *flags, "--search", "sharding")
    assert rc == 0  # and it does fit


def test_one_gpu_has_nothing_to_shard_over(capsys) -> None:
    rc, out = _plan(capsys, "--gpus", "1", "--global-batch-size", "1")
    assert rc == 3 and "alone overflow 80.00 GB" in out and HINT not in out
