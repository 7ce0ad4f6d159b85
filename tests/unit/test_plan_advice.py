"""What `plan` advises when no split fits (ppsim.plan.advice): recompute only where more
of it is left to turn on. Llama 3 70B at tp 4, pp 2, dp 8 on 80 GB: no split fits at
selective recompute (FlashAttention keeps no scores, so selective saves little) nor at
block recompute of 2 layers; full recompute fits."""

from __future__ import annotations

import pytest
from helpers import run_main

JOB = ["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "2", "--tp", "4",
       "--dp", "8", "--use-distributed-optimizer", "--microbatches", "16", "--time-budget", "3"]


@pytest.mark.parametrize(("recompute", "advice", "not_advised"), [
    (["--recompute", "none"], "activation recompute (--recompute selective or full)", None),
    (["--recompute", "selective"], "full activation recompute (--recompute full)",
     "selective or full"),
    (["--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "2"], "plan --search policy", "--recompute selective or full"),
])
def test_recompute_is_advised_only_where_more_is_left(recompute: list[str], advice: str,
                                                      not_advised: str | None) -> None:
    """It advised "--recompute selective or full" whatever the job already recomputed."""
    code, _, err = run_main([*JOB, *recompute])
    assert code == 3 and len(err.strip().splitlines()) == 1
    assert advice in err
    assert not_advised is None or not_advised not in err


def test_full_recompute_fits() -> None:
    code, out, _ = run_main([*JOB, "--recompute", "full", "--json"])
    assert code == 0 and '"fits": true' in out


def test_a_search_that_fits_nothing_reports_its_lowest_variant_not_the_configured() -> None:
    """`--search recompute` tried full recompute and still fit nothing (Llama 3 70B at tp 8,
    pp 2, dp 1): it reported the configured variant's peak and advised --recompute full."""
    base = ["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "2",
            "--time-budget", "3"]
    code, _, configured = run_main(base)
    assert code == 3
    code, _, searched = run_main([*base, "--search", "recompute"])
    assert code == 3 and len(searched.strip().splitlines()) == 1

    def peak(err: str) -> float:
        return float(err.split("reaches is ")[1].split(" GB")[0])

    assert peak(searched) < peak(configured)
    assert "the lowest of the 3 variants searched: 1f1b vpp=1 m=8 recompute=full" in searched
    assert "--recompute full" not in searched
