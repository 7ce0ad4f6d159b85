"""A GPU-class model in a config that chooses no hardware is priced on h100-80gb, as
`--preset` alone is, and says so; it ran on the bare defaults (989 TFLOP/s at 50 %, every
link free) without a word. A [hardware] table without a preset gets a note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_main


def _time(argv: list[str]) -> tuple[float, str]:
    code, out, err = run_main(["simulate", *argv, "--json"])
    assert code == 0, err
    return json.loads(out)["iteration_time_ms"], err


@pytest.mark.parametrize("preset", ["llama3-8b", "mixtral-8x7b", "gpt3-1.3b"])
@pytest.mark.parametrize("hardware", ["", "[hardware]\n", "[hardware]\nmemory_bytes = 80e9\n"])
def test_a_config_without_hardware_is_priced_as_the_preset_flag(preset: str, hardware: str,
                                                                tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\npreset = "{preset}"\n{hardware}')
    from_config, said = _time(["--config", str(cfg)])
    from_flag, _ = _time(["--preset", preset])
    named, _ = _time(["--preset", preset, "--hardware", "h100-80gb"])
    assert from_config == from_flag == named
    assert said.strip() == (f"ppsim simulate: assuming --hardware h100-80gb: its model "
                            f"{preset} is GPU-class and {cfg} chooses no hardware "
                            "([hardware] preset = NAME chooses one)")


def test_the_config_s_memory_is_kept(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\nmemory_bytes = 40e9\n')
    code, out, _ = run_main(["simulate", "--config", str(cfg), "--json"])
    assert code == 0 and json.loads(out)["memory_limit_bytes"] == 40e9


def test_a_hardware_table_without_a_preset_is_kept_with_a_note(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npeak_tflops = 500\n')
    own, said = _time(["--config", str(cfg)])
    h100, _ = _time(["--preset", "llama3-8b", "--hardware", "h100-80gb"])
    assert own != h100
    assert "note: [hardware] in" in said and "names no preset" in said


def test_a_chosen_hardware_is_never_replaced(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npreset = "a100-80gb"\n')
    own, said = _time(["--config", str(cfg)])
    a100, _ = _time(["--preset", "llama3-8b", "--hardware", "a100-80gb"])
    assert own == a100 and said == ""


@pytest.mark.parametrize("preset", ["tiny-gpt", "tiny-llm"])
def test_a_cpu_sized_preset_in_a_config_runs_on_the_cpu_preset_as_the_flag(
        preset: str, tmp_path: Path) -> None:
    """It ran on the bare roofline: tiny-gpt at 0.005 ms an iteration."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\npreset = "{preset}"\n')
    from_config, said = _time(["--config", str(cfg)])
    from_flag, _ = _time(["--preset", preset])
    on_cpu, _ = _time(["--preset", preset, "--hardware", "cpu"])
    assert from_config == from_flag == on_cpu and said == ""


def test_a_registry_function_s_model_is_named_as_the_user_gave_it() -> None:
    """--torchtitan-config chose the preset: the note names the function, not a --preset
    the line never had."""
    code, _, err = run_main(["simulate", "--torchtitan-config", "llama3_8b", "--gpus", "8"])
    assert code == 0, err
    assert ("assuming --hardware h100-80gb: --torchtitan-config llama3_8b's model is a "
            "GPU-class model") in err and "--preset" not in err
