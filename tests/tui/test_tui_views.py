"""Issue 12's "what to build": memory at a glance, layout, keys, clipboard, comparison."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from textual import events

from ppsim.cli.main import main as ppsim_main
from ppsim.config.model import parse_model
from ppsim.config.schema import load_config
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.tui.app import PPSimApp
from ppsim.tui.compare import rank_deltas
from ppsim.tui.headline import headline_text, memory_text, over_limit
from ppsim.tui.lanes import Lane, LaneOp, find_op, parse_find, ruler
from ppsim.tui.session import evaluate_state, state_from_config
from ppsim.tui.split_editor import SplitEditor, kinds_summary
from ppsim.tui.testing import SIZE, preset_on_default, screen_text, settle
from ppsim.tui.timeline import Timeline
from ppsim.units import fmt_bytes


def text_of(app: PPSimApp) -> str:
    return "\n".join(screen_text(app))


def summary(counts: tuple[int, ...], **pipeline) -> object:
    cfg = load_config(None)
    cfg.pipeline.split = list(counts)
    for k, v in pipeline.items():
        setattr(cfg.pipeline, k, v)
    return simulate(build_problem(cfg)).summary


# ------------------------------------------------------------------ memory at a glance


def test_memory_text_names_the_worst_rank_and_the_excess() -> None:
    cfg = load_config(None)
    cfg.model = parse_model({"preset": "llama3-70b"})
    cfg.pipeline.split = None
    s = simulate(build_problem(cfg)).summary
    over = over_limit(s, 16e9)
    assert over and over[0][1] == max(r.peak_memory_bytes for r in s.ranks) - 16e9
    text = memory_text(s, 16e9)
    assert text.startswith(f"DOES NOT FIT: r{over[0][0]} ") and "over" in text
    assert "+1 more rank" in text
    assert memory_text(s, 16e9, no_split=True).startswith(f"NO SPLIT FITS: r{over[0][0]} ")
    assert memory_text(summary((5, 3)), 16e9) == "fits"


def test_an_80_column_headline_over_the_limit_keeps_the_rank_and_the_speedup() -> None:
    """Before: `NO SPLIT FITS: r1 137.25 GB over (153.25 GB /…` at 80 columns, the
    speedup against the even split cut off; now the rank and its excess, then the rest."""
    cfg = load_config(None)
    cfg.model = parse_model({"preset": "llama3-70b"})
    cfg.pipeline.split = [12, 68]
    result = evaluate_state(cfg, state_from_config(cfg))
    over = over_limit(result.sim.summary, cfg.hardware.memory_bytes)
    first = headline_text(result, width=78).plain.splitlines()[0]
    assert f"FITS: r{over[0][0]} +{fmt_bytes(over[0][1])}" in first, first  # NO SPLIT FITS
    assert "x vs even" in first and "…" not in first, first
    assert "(+1 more rank)" in headline_text(result, width=200).plain


async def test_a_split_that_does_not_fit_where_another_would_says_does_not_fit() -> None:
    """Llama 3 8B at pp 4 within 39 GB: the even split's first rank is over, an uneven
    split fits (plan --gpus finds one), so the headline does not say no split fits."""
    cfg = load_config(None)
    cfg.model = parse_model({"preset": "llama3-8b", "seq_length": 512})
    cfg.pipeline.pp, cfg.pipeline.microbatches, cfg.pipeline.split = 4, 16, None
    cfg.hardware.memory_bytes = 39e9
    app = PPSimApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert not app.result.sim.summary.fits and not app.result.no_split_fits
        assert "DOES NOT FIT: r0 " in text_of(app)


async def test_headline_and_split_table_mark_the_rank_over_the_limit() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "!" not in "".join(line[:60] for line in screen_text(app)[14:20])
        app.query_one("#set-model").value = "llama3-70b"
        await settle(pilot)
        text = text_of(app)
        # 70B on two 16 GB CPU ranks: no split of it fits, and the headline says so.
        assert "NO SPLIT FITS: r0 " in text and app.result.no_split_fits
        # after the marks, each stage's memory policy letter (selective: R)
        assert "   0 r0  c0   40     0 E !R" in text and "   1 r1  c0   40    40  H!R" in text


# ------------------------------------------------------------------ comparison


def test_rank_deltas_are_current_minus_pinned() -> None:
    a, b = summary((4, 4)), summary((6, 2))
    d = rank_deltas(a, b)
    assert [x.rank for x in d] == [0, 1]
    assert d[0].busy_delta_ms == pytest.approx(b.ranks[0].busy_ms - a.ranks[0].busy_ms)
    assert d[1].peak_delta_bytes == b.ranks[1].peak_memory_bytes - a.ranks[1].peak_memory_bytes


async def test_pin_a_split_and_compare_per_rank() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "current [6, 2] vs even split [4, 4]" in text_of(app)
        await pilot.press("b")  # pin (6, 2)
        await settle(pilot)
        await pilot.press("right")
        await settle(pilot)
        text = text_of(app)
        assert "current [7, 1] vs pinned split [6, 2]" in text
        pin, cur = summary((6, 2)), summary((7, 1))
        d0 = cur.ranks[0].busy_ms - pin.ranks[0].busy_ms
        assert f"{d0:+.2f}" in text
        assert app.result.speedup == pytest.approx(pin.iteration_time_ms /
                                                   cur.iteration_time_ms)
        await pilot.press("v")
        await pilot.pause()
        labels = [lane.label for lane in app.query_one(Timeline).lanes]
        assert labels == ["r0", "pin0", "r1", "pin1"]
        await pilot.press("left", "b")  # b on the pinned split: back to the even split
        await settle(pilot)
        assert app.pinned is None and "vs even split [4, 4]" in text_of(app)


async def test_cursor_shows_the_real_ops_difference(tmp_path: Path) -> None:
    trace = tmp_path / "real.json"
    with redirect_stdout(io.StringIO()):
        assert ppsim_main(["simulate", "--split", "4,4", "--trace", str(trace)]) == 0
    cfg = load_config(None)
    cfg.pipeline.split = [4, 4]  # the trace's own split (another one's figures are hidden)
    app = PPSimApp(cfg, trace_path=str(trace))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tl = app.query_one(Timeline)
        tl.focus()
        await pilot.press("right")
        await pilot.pause()
        sim_op = tl.current_op()
        real = next(lane for lane in tl.lanes if lane.source == "real" and lane.rank == 0)
        match = next(o for o in real.ops if (o.kind, o.microbatch) ==
                     (sim_op.kind, sim_op.microbatch))
        info = str(app.query_one("#cursor-info").render())
        delta = (match.end - match.start) - (sim_op.end - sim_op.start)
        assert f"real start {match.start:.3f} ms" in info and f"({delta:+.3f}" in info


# ------------------------------------------------------------------ keys


def test_find_queries() -> None:
    assert parse_find("r3 b12") == (3, "B", 12)
    assert parse_find("F7") == (None, "F", 7)
    assert parse_find("12") == (None, None, 12)
    with pytest.raises(ValueError):
        parse_find("rank three")
    assert parse_find("r3 r3 b12 12") == (3, "B", 12)  # the same value twice is one
    for query, second in (("r3 r4", "'r4'"), ("F1 B1", "'B1'"), ("F1 2", "'2'")):
        with pytest.raises(ValueError, match=f"{second} gives a second"):
            parse_find(query)
    lanes = [Lane("r0", (LaneOp(0, 1, "F", 0, 0, 0), LaneOp(1, 2, "B", 0, 0, 0)), 0),
             Lane("r1", (LaneOp(0, 1, "F", 0, 0, 1), LaneOp(1, 2, "B", 0, 0, 1)), 1)]
    assert find_op(lanes, "b0") == (0, 1)
    assert find_op(lanes, "b0", (0, 1)) == (1, 1)
    assert find_op(lanes, "b0", (1, 1)) == (0, 1)  # wraps
    assert find_op(lanes, "w") is None


def test_axis_labels_keep_their_digits_at_deep_zoom() -> None:
    labels = [t.strip("|") for t in ruler(1e-4, 100_000_000, 100).split()]
    assert len(labels) >= 3 and len(set(labels)) == len(labels)
    assert ruler(1.0, 0, 25).startswith("|0ms      |10ms     |20ms")


async def test_number_keys_jump_to_panels_and_escape_leaves_a_field() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("3")
        assert app.focused is app.query_one(Timeline)
        await pilot.press("4")
        assert app.focused is app.query_one("#compare-box")
        await pilot.press("1")
        assert app.focused is app.query_one("#set-schedule")
        await pilot.press("2")
        assert app.focused is app.query_one("#split-rows")
        app.query_one("#set-pp").focus()
        await pilot.press("escape")
        assert app.focused is app.query_one("#split-rows")


async def test_slash_finds_an_op_and_n_the_next() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await pilot.pause()
        app.screen.query_one("#prompt-input").value = "r1 b3"
        await pilot.press("enter")
        await pilot.pause()
        tl = app.query_one(Timeline)
        op = tl.current_op()
        assert tl.lanes[tl.cursor[0]].rank == 1 and (op.kind, op.microbatch) == ("B", 3)
        await pilot.press("slash")
        await pilot.pause()
        app.screen.query_one("#prompt-input").value = "f"
        await pilot.press("enter", "n")
        await pilot.pause()
        assert tl.current_op().kind == "F"


async def test_zoom_keeps_the_cursor_in_place_and_the_wheel_scrolls_time() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tl = app.query_one(Timeline)
        tl.focus()
        await pilot.press(*["right"] * 12)
        await pilot.pause()
        op = tl.current_op()

        def screen_x() -> float:
            return (op.start + op.end) / 2 / tl.ms_per_cell - tl.scroll_x

        before = screen_x()
        await pilot.press("plus", "plus", "plus")
        await pilot.pause()
        assert tl.scroll_x > 0 and abs(screen_x() - before) <= 1.5
        x = tl.scroll_x
        tl.post_message(events.MouseScrollDown(tl, 10, 2, 0, 0, 0, False, False, False))
        await pilot.pause()
        assert tl.scroll_x > x


async def test_click_selects_an_op() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tl = app.query_one(Timeline)
        await pilot.click(tl, offset=(30, 3))  # border + ruler + r0: y 3 is lane r1
        await pilot.pause()
        assert tl.cursor[0] == 1 and tl.current_op() is not None


async def test_help_says_how_to_close_it_and_explains_the_timeline() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        text = text_of(app)
        for words in ("Close this help with Escape", "weight-grad", "later chunk",
                      "lower case", "/ find"):
            assert words in text
        await pilot.press("escape")
        await pilot.pause()
        assert "Close this help" not in text_of(app)


async def test_y_copies_the_export_to_the_clipboard() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("y")
        await pilot.pause()
        assert "MEGATRON_ARGS=" in app.clipboard and "TORCHTITAN_FQNS=" in app.clipboard


# ------------------------------------------------------------------ layout


async def test_80_columns_keep_the_timeline_wide_and_the_global_keys() -> None:
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.query_one("#left").size.width <= 30
        assert app.query_one(Timeline).size.width >= 48
        footer = screen_text(app)[-1]
        for key in ("q Quit", "? Help", "u Undo", "p Plan", "/ Find"):
            assert key in footer
        wide = PPSimApp()
    async with wide.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert wide.query_one("#left").size.width == 52


async def test_pp_16_has_a_memory_row_per_rank_that_scrolls_into_view() -> None:
    app = PPSimApp(preset_on_default("llama3-70b", 16, 32, memory_bytes=80e9))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        box = app.query_one("#compare-box")
        assert len(app.query_one("#memory").bars) == 16
        box.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert "r15 " in text_of(app)


# ------------------------------------------------------------------ layer kinds


def test_kinds_summary() -> None:
    kinds = ("dense",) * 3 + ("moe",) * 5
    assert kinds_summary(kinds, 0, 8) == "3 dense + 5 moe"
    assert kinds_summary(kinds, 3, 2) == "2 moe"
    assert kinds_summary((), 0, 8) == ""
    assert kinds_summary(kinds, 8, 0) == "no layers"


async def test_split_editor_shows_each_stages_layer_kinds() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        kinds = ("dense",) * 3 + ("moe",) * 4 + ("mtp",)
        app.query_one(SplitEditor).set_split(app.state.split, frozenset(), kinds)
        await pilot.pause()
        text = text_of(app)
        assert "3 dense + 3 moe" in text and "1 moe + 1 mtp" in text
