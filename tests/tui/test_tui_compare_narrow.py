"""The compare panel at 80 columns (44 columns of text): every figure readable.

Before: the delta table was 48 columns wide, so `Δ mem` was always cut (`+3.…`),
the iteration line lost its difference (`(+346.…`), and an edited split read
`current [10, …, 10] vs even [10, …, 10]`, hiding the stages that differ.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

from hypothesis import given
from hypothesis import strategies as st

from ppsim.tui.app import PPSimApp
from ppsim.tui.compare import counts_line, delta_lines, delta_table, rank_deltas
from ppsim.tui.testing import preset_config, screen_text, settle
from ppsim.units import fmt_bytes

WIDTH = 44
"""The compare panel's text width in an 80x24 terminal."""


def summary(ms: float, ranks: list[tuple[float, int]]) -> NS:
    return NS(iteration_time_ms=ms, ranks=[NS(rank=i, busy_ms=b, peak_memory_bytes=p)
                                           for i, (b, p) in enumerate(ranks)])


def result(cur: list[int], pin: list[int], ms: tuple[float, float],
           ranks: list[tuple[tuple[float, int], tuple[float, int]]]) -> NS:
    return NS(pinned=NS(summary=summary(ms[1], [r[1] for r in ranks])),
              sim=NS(summary=summary(ms[0], [r[0] for r in ranks])), pinned_is_even=True,
              state=NS(counts=tuple(cur)), pinned_counts=tuple(pin))


def test_an_edited_split_names_the_stages_that_differ() -> None:
    line = counts_line([10, 11, 9, 10, 10, 10, 10, 10], [10] * 8, "even", WIDTH)
    assert len(line) <= WIDTH
    assert "s1 11 vs 10" in line and "s2 9 vs 10" in line


def test_equal_or_short_splits_keep_their_lists() -> None:
    assert counts_line([6, 2], [4, 4], "even", WIDTH) == "current [6, 2] vs even [4, 4]"
    same = counts_line([10] * 8, [10] * 8, "even", WIDTH)
    assert same.startswith("current [10, ") and len(same) <= WIDTH


def test_the_iteration_difference_survives_80_columns() -> None:
    r = result([10, 11], [11, 10], (5696.11, 5349.624), [((1.0, 1), (1.0, 1))])
    line = delta_lines(r, WIDTH)[1]
    assert len(line) <= WIDTH and "(+346.486)" in line and "5696.110" in line


@given(st.lists(st.tuples(st.floats(0, 99_999), st.floats(0, 99_999),
                          st.integers(0, 999 * 10**9), st.integers(0, 999 * 10**9)),
                min_size=1, max_size=40),
       st.integers(WIDTH, 140))
def test_the_table_fits_and_keeps_every_figure_apart(rows: list, width: int) -> None:
    deltas = rank_deltas(summary(1.0, [(b0, p0) for b0, _, p0, _ in rows]),
                         summary(1.0, [(b1, p1) for _, b1, _, p1 in rows]))
    big = max(max(r[0], r[1]) for r in rows) >= 1e5
    lines = delta_table(deltas, width)
    assert all(len(x) <= width for x in lines), lines
    for d, line in zip(deltas, lines[1:], strict=True):
        mem = ("-" if d.peak_delta_bytes < 0 else "+") + fmt_bytes(abs(d.peak_delta_bytes))
        scale = 1e3 if big else 1.0
        assert line.split() == [f"r{d.rank}", f"{d.busy_ms[1] / scale:.2f}",
                                f"{d.busy_delta_ms / scale:+.2f}",
                                *fmt_bytes(d.peak_bytes[1]).split(), *mem.split()]


async def test_80x24_shows_the_memory_delta_whole() -> None:
    app = PPSimApp(preset_config("llama3-70b", 8, 32))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("2", "down", "right")
        await settle(pilot)
        text = "\n".join(screen_text(app))
        assert "current vs even: s1 11 vs 10, s2 9 vs 10" in text
        row = next(x for x in screen_text(app) if "│ r1 " in x)
        assert "…" not in row and row.split("│")[-2].split()[-2:][1] in ("GB", "MB", "kB")


def test_equal_iterations_differ_by_plus_zero() -> None:
    """Before: a rounding residue (5087.03 - 5087.030000000001) read `(-0.000)`."""
    r = result([10, 11], [11, 10], (5087.03, 5087.030000000001), [((1.0, 1), (1.0, 1))])
    assert delta_lines(r, 100)[1].endswith("(+0.000 ms)")
    assert delta_lines(r, WIDTH)[1].endswith("(+0.000)")
