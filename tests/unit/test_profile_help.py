"""`ppsim profile --help` says what the profile keeps: each op's mean over its repeats
(executor/profile.py), as docs/model.md says."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main


def test_repeats_help_says_the_mean_is_kept(capsys) -> None:
    """The help said the median is kept; the cost file holds the mean."""
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "timed repeats per op after warm-up; their mean is kept" in text
