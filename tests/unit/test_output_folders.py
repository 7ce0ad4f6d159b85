"""An output whose folder is missing, or takes no new file, is refused before any work:
exit 2, one line naming the flag, and no folder made (a typo in a folder name would
otherwise leave a stray tree, and a long profile would end in a failed write)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ppsim.cli.main import main


def _one_line_refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("argv", "flag"), [
    (["simulate", "--trace"], "--trace"),
    (["simulate", "--png"], "--png"),
    (["plan", "--png"], "--png"),
    (["diff", "TRACE", "TRACE", "--png"], "--png"),
    (["calibrate", "TRACE", "--out"], "--out"),
    (["schedule", "--csv"], "--csv"),
    (["profile", "--out"], "--out"),
    (["profile", "--hardware-out"], "--hardware-out"),
])
def test_an_output_into_a_missing_folder_is_refused(argv: list[str], flag: str, sim_trace: str,
                                                    tmp_path: Path, capsys) -> None:
    missing = tmp_path / "no-such-folder"
    argv = [sim_trace if a == "TRACE" else a for a in argv] + [str(missing / "out.x")]
    err = _one_line_refusal(capsys, argv)
    assert err.startswith(f"ppsim {argv[0]}: error: {flag}: "), err
    assert "no-such-folder does not exist" in err and "create the folder" in err, err
    assert not missing.exists()


@pytest.mark.skipif(not os.path.isdir("/sys"), reason="needs Linux's /sys")
def test_an_output_in_a_folder_that_takes_no_file_is_refused_before_measuring(capsys) -> None:
    # /sys refuses a new file even to root (for whom permission bits say nothing): the
    # refusal comes before the profile's progress lines, not after its measurements.
    err = _one_line_refusal(capsys, ["profile", "--out", "/sys/ppsim-costs.json"])
    assert err.startswith("ppsim profile: error: --out: /sys/ppsim-costs.json: cannot write")
