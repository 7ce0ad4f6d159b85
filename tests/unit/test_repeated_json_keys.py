"""A JSON input (a cost file, a DeepSpeed config) that gives one key twice in an object
is refused, as TOML refuses it and DeepSpeed refuses its own config: JSON would keep
only the last value and silently drop the first."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppsim.cli.main import main

COSTS = Path(__file__).parents[2] / "traces" / "1f1b-5-3-m8" / "costs.json"


def _costs_with_repeat(tmp_path: Path) -> str:
    text = COSTS.read_text()
    assert text.count('"forward_ms":') > 1
    path = tmp_path / "costs.json"
    path.write_text(text.replace('"forward_ms":', '"forward_ms":99,"forward_ms":', 1))
    return str(path)


def _ds_with_repeat(tmp_path: Path) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 16, "train_batch_size": 32}\n')
    return str(path)


@pytest.mark.parametrize(("make", "argv", "flag", "key"), [
    (_costs_with_repeat, ["simulate", "--costs"], "--costs", "forward_ms"),
    (_ds_with_repeat, ["split", "--deepspeed-config"], "--deepspeed-config",
     "train_batch_size"),
])
def test_a_key_given_twice_in_a_json_input_is_refused(make, argv: list[str], flag: str,
                                                      key: str, tmp_path: Path,
                                                      capsys) -> None:
    code = main([*argv, make(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"ppsim {argv[0]}: error: {flag}: "), err
    assert f"gives the key '{key}' twice" in err, err


def test_the_unrepeated_files_are_read(tmp_path: Path, capsys) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 16, "zero_optimization": {"stage": 1}}\n')
    assert main(["simulate", "--costs", str(COSTS), "--json"]) == 0
    assert main(["split", "--deepspeed-config", str(path)]) == 0, capsys.readouterr().err
