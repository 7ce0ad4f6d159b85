"""Flags of the commands that start processes are refused in one line before any start:
a --seed the ranks' 64-bit torch seeds cannot hold (it failed in every rank after the
launch), and a --sustained warm-up given to a cost file's profile (where it did nothing,
whatever its value)."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main


@pytest.mark.parametrize(("argv", "flag", "says"), [
    (["run", "--print-launch", "--seed", "99999999999999999999"], "--seed",
     "between 0 and 4,294,967,295"),
    (["run", "--print-launch", "--seed", "-1"], "--seed", "between 0 and 4,294,967,295"),
    (["profile", "--sustained", "nan"], "--sustained", "--hardware-out"),
    (["profile", "--sustained", "-1"], "--sustained", "--hardware-out"),
    (["profile", "--sustained", "5"], "--sustained", "--hardware-out"),
])
def test_a_launch_flag_out_of_place_or_range_is_refused(argv: list[str], flag: str,
                                                        says: str, capsys, tmp_path,
                                                        monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # where a profile that went ahead would write costs.json
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"ppsim {argv[0]}: error: {flag}: "), err
    assert says in err, err


def test_the_largest_seed_reaches_the_launch(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--print-launch", "--seed", "4294967295"]) == 0
    assert "4294967295" in capsys.readouterr().out  # in the run spec it prints
