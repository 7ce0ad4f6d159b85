"""A config's routed experts get Megatron's router defaults as its flags do: top-k 2 and
each expert as wide as the dense MLP (a `[model]` with num_experts and no top_k routed no
token and timed an iteration at a third of the flags' time); a top-k below 1 is refused
wherever it is given."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.model import parse_model
from ppsim.errors import UserError


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moe")


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([2, 4, 8, 16]), st.sampled_from(["llama3-8b", "tiny-gpt", "gpt3-1.3b"]))
def test_a_config_and_megatron_s_flags_give_one_moe_model(folder: Path, experts: int,
                                                           preset: str) -> None:
    from_config = parse_model({"preset": preset, "num_experts": experts}).arch
    dense = parse_model({"preset": preset}).arch
    # Megatron's defaults (arguments.py): --moe-router-topk 2, --moe-ffn-hidden-size
    # the dense --ffn-hidden-size.
    assert from_config.top_k == 2
    assert from_config.moe_ffn_hidden_size == dense.ffn_hidden_size
    code, out, _ = run_main(["costs", "--preset", preset, "--num-experts", str(experts),
                             "--hardware", "h100-80gb", "--json"])
    cfg = folder / f"{preset}-{experts}.toml"
    cfg.write_text(f'[model]\npreset = "{preset}"\nnum_experts = {experts}\n')
    code2, out2, _ = run_main(["costs", "--hardware", "h100-80gb", "--json", "--config",
                               str(cfg)])
    assert code == code2 == 0 and out == out2


@pytest.mark.parametrize("argv, field", [
    (["--preset", "mixtral-8x7b", "--moe-router-topk", "0"], "--moe-router-topk"),
    (["--preset", "mixtral-8x7b", "--moe-router-topk", "-2"], "--moe-router-topk"),
])
def test_a_top_k_below_1_is_refused_by_flag(argv, field) -> None:
    code, _, err = run_main(["simulate", *argv])
    assert code == 2 and f"error: {field}: must be at least 1" in err


def test_a_top_k_below_1_is_refused_in_a_config() -> None:
    with pytest.raises(UserError) as e:
        parse_model({"preset": "llama3-8b", "num_experts": 8, "top_k": 0})
    assert e.value.field == "model.top_k"


def test_a_hybrid_pattern_s_moe_layers_take_the_defaults_too() -> None:
    """An 'E' in a config's pattern with num_experts alone was "set all three"; the
    flags took Megatron's defaults."""
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-ME"
    arch = parse_model({"preset": "nemotron-h-8b", "hybrid_layer_pattern": pattern,
                        "num_experts": 8}).arch
    assert (arch.top_k, arch.moe_ffn_hidden_size) == (2, arch.ffn_hidden_size)
