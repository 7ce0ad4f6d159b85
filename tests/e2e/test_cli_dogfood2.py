"""An infra engineer's pass over the less-used commands (in-process, seconds): what
`presets NAME` prints is a file `simulate` reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppsim.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ["h100-80gb", "cpu"])
def test_a_hardware_presets_output_redirected_is_a_hardware_file(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ppsim presets h100-80gb > hw.toml` then `--hardware hw.toml`: the lines around
    the table are TOML comments, so the file prices as the preset does."""
    code, out, err = _run(capsys, ["presets", name])
    assert code == 0, err
    hw = tmp_path / "hw.toml"
    hw.write_text(out)
    job = ["simulate", "--preset", "tiny-gpt", "--pp", "2", "--json"]
    code, by_name, err = _run(capsys, [*job, "--hardware", name])
    assert code == 0, err
    code, by_file, err = _run(capsys, [*job, "--hardware", str(hw)])
    assert code == 0, err
    assert json.loads(by_file)["iteration_time_ms"] == json.loads(by_name)["iteration_time_ms"]
