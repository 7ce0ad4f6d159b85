"""Megatron's recompute flags read in the context of its granularity flag.

Megatron-LM (megatron/core/transformer/attention.py, transformer_layer.py,
moe/experts.py, moe/moe_layer.py, multi_latent_attention.py) recomputes a module only
where `recompute_granularity == 'selective'`; under full granularity TransformerConfig
checks the method and the layer count and never reads `recompute_modules`.
megatron/training/arguments.py asserts "recompute method is not yet supported for
selective recomputing granularity"; TransformerConfig.__post_init__ raises "Using
recompute_granularity: full so recompute_method must be "block" or "uniform"".
Without any granularity flag, --recompute-modules and --recompute-num-layers are
ppsim's own policy flags and are priced as given."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from ppsim.cli.main import main

LLAMA = ["simulate", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "4",
         "--microbatches", "8"]


def _run(flags: str) -> tuple[int, dict | None, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([*LLAMA, *flags.split(), "--json"])
    return code, json.loads(out.getvalue()) if code == 0 else None, err.getvalue()


@pytest.mark.parametrize("megatron, without", [
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
     "--recompute-modules mlp core_attn",
     "--recompute-granularity full --recompute-method block --recompute-num-layers 2"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
     "--recompute-modules mlp",
     "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
])
def test_modules_beside_full_granularity_are_ignored_as_megatron_ignores_them(
        megatron: str, without: str) -> None:
    code, got, err = _run(megatron)
    assert code == 0  # refused before, though Megatron runs the line
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ")
    assert "--recompute-modules" in lines[0] and "--recompute-granularity full" in lines[0]
    code, want, err = _run(without)
    assert code == 0 and err == ""
    assert got == want


def test_the_warning_says_what_block_recompute_ppsim_prices() -> None:
    _, got, err = _run("--recompute-granularity full --recompute-method block "
                       "--recompute-num-layers 2 --recompute-modules mlp")
    assert "first 2 layers" in err
    assert {(tuple(p["recompute_modules"]), p["recompute_layers"]) for p in got["policy"]} \
        == {((), 2)}


@pytest.mark.parametrize("flags, field, words", [
    ("--recompute-granularity selective --recompute-method uniform", "--recompute-method",
     "recompute method is not yet supported for selective recomputing granularity"),
    ("--recompute-granularity full --recompute-num-layers 2", "--recompute-method",
     'Using recompute_granularity: full so recompute_method must be "block" or "uniform"'),
])
def test_megatrons_refusals_are_in_megatrons_words(flags: str, field: str,
                                                   words: str) -> None:
    code, _, err = _run(flags)
    assert code == 2 and len(err.splitlines()) == 1
    assert f"error: {field}: {words}" in err


def test_ppsim_s_own_shorthand_keeps_its_modules() -> None:
    """No Megatron granularity on the line: --recompute-modules is ppsim's policy flag."""
    code, got, err = _run("--recompute none --recompute-modules mlp")
    assert code == 0 and err == ""
    assert {tuple(p["recompute_modules"]) for p in got["policy"]} == {("mlp",)}


def test_full_shorthand_with_a_layer_count_prices_megatrons_block_method() -> None:
    """[memory] keys replace the --recompute mode's: `--recompute full
    --recompute-num-layers 3` is Megatron's block method over 3 layers, no modules."""
    code, ours, err = _run("--recompute full --recompute-num-layers 3")
    assert code == 0 and err == ""
    assert {(tuple(p["recompute_modules"]), p["recompute_layers"]) for p in ours["policy"]} \
        == {((), 3)}
    _, megatron, _ = _run("--recompute-granularity full --recompute-method block "
                          "--recompute-num-layers 3")
    assert ours == megatron
