"""The plain functions behind issue 26: cut text, count lists, zoom, planner text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.tui.lanes import zoom_scroll, zoomed_scale
from ppsim.tui.memory import ROW_HEAD, Bar, bar_cells, bar_label, fitted_labels
from ppsim.tui.planning import progress_text, same_but_split
from ppsim.tui.session import EditState
from ppsim.tui.text import ELLIPSIS, counts_text, cut, one_line, thousands
from ppsim.units import fmt_bytes

FEW = settings(max_examples=60, deadline=None)


@FEW
@given(st.text(max_size=60), st.integers(1, 80))
def test_cut_fits_and_marks_what_it_cut(text: str, width: int) -> None:
    out = cut(text, width)
    assert len(out) <= width
    if len(text) <= width:
        assert out == text
    else:
        assert out.endswith(ELLIPSIS) and text.startswith(out[:-1])


@FEW
@given(st.lists(st.integers(0, 120), min_size=1, max_size=40), st.integers(8, 200))
def test_counts_text_keeps_brackets_ends_and_marks_a_cut(counts: list[int], width: int) -> None:
    out = counts_text(counts, width)
    full = "[" + ", ".join(map(str, counts)) + "]"
    assert out.startswith("[" + str(counts[0])) and out.endswith(str(counts[-1]) + "]")
    shortest = f"[{counts[0]}, …, {counts[-1]}]"
    if len(full) <= width or len(shortest) >= len(full):
        assert out == full  # fits, or no cut would be shorter
    else:
        assert ELLIPSIS in out
        shown = [x for x in out[1:-1].split(", ") if x != ELLIPSIS]
        assert len(shown) < len(counts)
        head = shown[:len(shown) // 2]
        assert [str(c) for c in counts[:len(head)]] == head  # the first counts, in order


def test_counts_text_examples() -> None:
    assert counts_text([1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1], 21) == "[1, 2, 2, …, 2, 2, 1]"
    assert counts_text([10, 9], 3) == "[10, 9]"  # never without brackets; nothing to hide
    assert counts_text([10, 9]) == "[10, 9]"


def test_thousands_and_one_line() -> None:
    assert thousands(5843355957) == "5,843,355,957"
    assert one_line("a\n\n b \nc") == "a · b · c"


@FEW
@given(st.floats(0.0, 1e6), st.floats(1e-3, 1e3), st.floats(0.25, 4.0),
       st.integers(0, 10_000), st.integers(10, 300))
def test_zoom_keeps_the_anchor_on_its_screen_column(anchor: float, scale: float,
                                                    factor: float, x0: int, view: int) -> None:
    new = scale * factor
    x = zoom_scroll(anchor, scale, new, x0, view)
    assert x >= 0
    before = anchor / scale - x0
    after = anchor / new - x
    if 0 <= before < view and anchor / new - before >= 0:
        assert abs(after - before) <= 0.5 + 1e-9  # the same column, up to rounding
    else:
        assert 0 <= after < view or x == 0  # out of view before: brought into view


def test_repeated_zoom_from_the_target_keeps_the_cursor_in_view() -> None:
    """50 zooms in, each from where the previous one asked the view to be (key repeat
    faster than frames), keep the anchor in view; from the stale scroll they lose it."""
    anchor, scale, x, view, fit = 3000.0, 60.0, 0, 150, 60.0
    stale = x
    for _ in range(50):
        new = zoomed_scale(scale, 0.5, fit, 1e-3)
        x = zoom_scroll(anchor, scale, new, x, view)
        scale = new
    assert 0 <= anchor / scale - x < view
    assert not 0 <= anchor / scale - stale < view


def test_zoomed_scale_is_bounded() -> None:
    assert zoomed_scale(10.0, 2.0, 15.0, 0.01) == 15.0
    assert zoomed_scale(0.02, 0.5, 15.0, 0.015) == 0.015
    assert zoomed_scale(10.0, 0.5, 15.0, 0.01) == 5.0


def test_memory_bar_cells_round_and_a_tiny_peak_reads_under_1_percent() -> None:
    """Before: 12.63 MB of 16 GB drew two full cells and said "0 %"."""
    tiny = Bar(0, 9_000_000, 3_630_000, 12_630_000, True)
    assert bar_cells(tiny, 16e9, 20) == (0, 0, 20)
    assert "<1%" in bar_label(tiny, 16e9) and " 0%" not in bar_label(tiny, 16e9)
    fits = Bar(0, 20, 30, 50, True)
    assert bar_cells(fits, 100, 10) == (2, 3, 5)
    over = Bar(1, 100, 100, 200, False)
    assert sum(bar_cells(over, 100, 10)[:2]) == 10


@FEW
@given(st.integers(0, 10**12), st.integers(0, 10**12), st.integers(0, 10**12),
       st.integers(1, 200))
def test_memory_bar_cells_fill_the_width(static: int, act: int, limit: int,
                                         width: int) -> None:
    bar = Bar(0, static, act, static + act, static + act <= limit)
    s, a, f = bar_cells(bar, limit, width)
    assert min(s, a, f) >= 0 and s + a + f == width


def test_memory_rows_keep_their_figures_whole_at_80_columns() -> None:
    """Before: the compare panel at 80x24 (44 columns) cut `static 13.2…`, a figure
    cut mid-number; now the bar shrinks, then the short form `= 26.04 + 22.66` stands in."""
    gb = 10**9
    for bars in ([Bar(0, 26_040_000_000, 22_660_000_000, 48_700_000_000, True)],
                 [Bar(1, 14_140_000_000, 112_430_000_000, 126_570_000_000, False)],
                 [Bar(0, 13_200_000, 6_340_000, 19_540_000, True)]):
        for width in (44, 64, 102):
            bar_w, labels = fitted_labels(bars, 80 * gb, width)
            for bar, label in zip(bars, labels, strict=True):
                assert ROW_HEAD + bar_w + len(label) <= width, (width, label)
                static = fmt_bytes(bar.static_bytes).split()[0]
                assert f" {static}" in label and "…" not in label, label
    assert fitted_labels([Bar(0, 1, 1, 2, True)], gb, 102)[1][0].startswith(" 2 B <1%  static")


def test_planner_progress_counts_with_separators() -> None:
    assert progress_text(1234567, 5843355957) == \
        "planner: 1,234,567 splits evaluated of 5,843,355,957 possible… (Esc stops it)"
    assert "of" not in progress_text(3, 0).split("evaluated")[1].split("(")[0]


def test_same_but_split() -> None:
    s = EditState(model_preset=None, recompute="none", schedule="1f1b", pp=2, vpp=1,
                  microbatches=8, counts=(6, 2), memory_bytes=16e9, hardware_preset="cpu")
    from dataclasses import replace

    assert same_but_split(s, replace(s, counts=(5, 3)))
    assert not same_but_split(s, replace(s, microbatches=16))
    assert not same_but_split(s, replace(s, memory_bytes=8e9, counts=(5, 3)))
