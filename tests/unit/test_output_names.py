"""An output given as "" (a command quietly wrote nothing) or "-" (a file named "-" in
the working folder, where a user may mean standard output) is refused in its flag's
name, before any work, by every command that writes files."""

from __future__ import annotations

import os

import pytest
from helpers import run_main

COMMANDS = [(["simulate"], "--trace"), (["simulate"], "--png"), (["plan"], "--png"),
            (["schedule"], "--csv"), (["profile", "--preset", "tiny-gpt"], "--out"),
            (["plan", "--preset", "tiny-gpt", "--gpus", "2", "--global-batch-size", "8"],
             "--png"),
            (["run"], "--trace-dir"), (["run"], "--dump-grads"), (["demo"], "--out")]


@pytest.mark.parametrize(("argv", "flag"), COMMANDS)
@pytest.mark.parametrize(("name", "words"), [("-", "'-' would be a file named '-' here"),
                                             ("", "is empty")])
def test_an_unnamed_output_is_refused(argv, flag, name, words, tmp_path,
                                      monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main([*argv, flag, name])
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    assert f"error: {flag}: {words}" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("argv", "flag", "measure"), [
    (["profile", "--preset", "tiny-gpt", "--no-p2p"], "--out", "ppsim.executor.measure.profile"),
    (["profile"], "--hardware-out", "ppsim.executor.hwprofile.measure_hardware")])
def test_a_directory_as_output_is_refused_before_measuring(argv, flag, measure, tmp_path,
                                                           monkeypatch) -> None:
    pytest.importorskip("torch")

    def measured(*a, **k):
        raise AssertionError("measured before refusing the output")

    monkeypatch.setattr(measure, measured)
    (tmp_path / "out").mkdir()
    code, _, err = run_main([*argv, flag, str(tmp_path / "out")])
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    assert f"error: {flag}: {tmp_path / 'out'}: is a directory" in err
