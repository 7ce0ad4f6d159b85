"""A hybrid stack's Megatron launch line: what Megatron builds from it, ppsim prices or
refuses (one line, exit 2)."""

from __future__ import annotations

import pytest
from helpers import run_cli

BASE = ["simulate", "--preset", "nemotron-h-8b", "--hardware", "h100-80gb", "--pp", "2"]
MODULE = "megatron.core.models.hybrid.hybrid_layer_specs"


@pytest.mark.parametrize("spec", [
    [MODULE, "gdp_stack_spec"],
    [MODULE, "gated_delta_product_stack_spec"],
    [f"[{MODULE},", "gdp_stack_spec]"],
])
def test_the_gated_delta_product_spec_is_refused(spec: list[str]) -> None:
    # Megatron's GDP stack spec swaps every 'M' layer for a Gated DeltaProduct mixer, and
    # its FLOP count follows (megatron/training/training.py _uses_gated_delta_product_spec,
    # hybrid_flops' use_gated_delta_product): ppsim took the spec silently and priced
    # Mamba-2 layers.
    ran = run_cli([*BASE, "--spec", *spec])
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and ran.stdout == ""
    assert len(lines) == 1 and "Gated DeltaProduct" in lines[0] and "--spec" in lines[0]


def test_the_hybrid_stack_spec_prices_its_mamba_layers() -> None:
    assert run_cli([*BASE, "--spec", MODULE, "hybrid_stack_spec"]).returncode == 0
