"""A split's counts in a table cell: within its width, and exact wherever not cut.

Tables cut splits at a fixed length ('5,4,4,4,4,4…'), so at 80 columns a pp-16 plan's
top five splits, which differ only near the end, read alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.cli.render import split_cell, split_runs


def _expand(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        count, _, times = part.partition("×")
        out += [int(count)] * int(times or 1)
    return out


@given(st.lists(st.integers(0, 20), min_size=1, max_size=64), st.integers(8, 40))
def test_counts_fit_their_width_and_read_back_unless_cut(counts: list[int], width: int
                                                         ) -> None:
    text = split_cell(counts, width)
    assert len(text) <= width
    plain = ",".join(map(str, counts))
    if len(plain) <= width:
        assert text == plain
    elif not text.endswith("…"):
        assert _expand(text) == counts


def test_a_pp16_plans_splits_read_apart() -> None:
    best = [5] + [4] * 12 + [3, 4, 2]
    second = [5] + [4] * 13 + [3, 2]
    assert split_cell(best) == "5,4×12,3,4,2"
    assert split_cell(second) == "5,4×13,3,2"
    assert split_cell([4, 4, 5]) == "4,4,5"
    assert split_cell([1, 2] * 20, 12) == "1,2,1,2,1,2…"


@given(st.lists(st.integers(0, 20), min_size=1, max_size=128))
def test_runs_read_back_every_count(counts: list[int]) -> None:
    assert _expand(split_runs(counts)) == counts


def test_simulates_header_keeps_a_long_split_on_one_line(capsys, monkeypatch) -> None:
    """Before: `split=[2, 2, ...]` ran over three lines at 80 columns (pp 8, vpp 5)."""
    monkeypatch.setenv("COLUMNS", "80")
    argv = ["simulate", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "8",
            "--vpp", "5", "--microbatches", "64"]
    assert main(argv) == 0
    head, second = capsys.readouterr().out.splitlines()[:2]
    assert head.rstrip().endswith("split=2×40") and len(head.rstrip()) <= 80
    assert second.startswith("iteration time")
    assert main(["simulate", "--num-layers", "8", "--pp", "2", "--split", "6,2"]) == 0
    assert "split=[6, 2]" in capsys.readouterr().out.splitlines()[0]  # short: as a list
