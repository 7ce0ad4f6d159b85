"""How the command line's flags combine: values that name nothing, one setting given
under two names, and the flag an error names."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a command refused with exit status 2."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("argv", [
    ["simulate", "--preset", ""], ["simulate", "--hardware="], ["plan", "--preset", " "],
    ["costs", "--costs", ""], ["simulate", "--actions-csv="], ["schedule", "--hardware", ""],
    ["simulate", "--compare-log", ""], ["tui", "--preset", ""],
    ["run", "--print-launch", "--model", ""], ["run", "--print-launch", "--versus", ""],
    ["profile", "--model", ""]])
def test_an_empty_name_or_path_is_refused_not_read_as_no_flag(
        argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--preset ''` (a shell variable left unset) ran the embedded default, `--hardware ''`
    the preset on the default's CPU: the flag's name and what to give, on one line."""
    monkeypatch.chdir(tmp_path)  # what a command run in spite of it would write
    flag = next(a.split("=")[0] for a in argv if a.startswith("--") and a != "--print-launch")
    line = _refused(argv, capsys)
    assert flag in line and "is empty" in line
