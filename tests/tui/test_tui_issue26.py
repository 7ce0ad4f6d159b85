"""Issue 26's defects 1-5 at 80x24 and 160x45, each driven as a user would (6-9:
test_tui_issue26_text.py).

Each test failed on the code before the fix; its docstring says what happened.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from helpers import fake_planner

from ppsim.config.schema import load_config
from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import on_screen, preset_config, screen_text, settle, status_text
from ppsim.tui.timeline import Timeline

ROOT = Path(__file__).parents[2]
SMALL, LARGE = (80, 24), (160, 45)


def llama(pp: int = 8, microbatches: int = 64):
    return preset_config("llama3-70b", pp, microbatches)


def deepseek():
    return preset_config("deepseek-v3", 16, 32, 2, "interleaved-1f1b")


status, visible = status_text, on_screen


# ------------------------------------------------------------------ 1. the split panel


async def test_a_long_refusal_keeps_the_split_panel_and_2_switches_to_it() -> None:
    """Before: the six-line refusal grew the settings panel and pushed the split panel
    off screen at 80x24, and the `2` after it was typed into the field (`642`)."""
    app = PPSimApp(llama())
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        assert visible(app, "#split-editor", SMALL)
        await pilot.press("1", *["tab"] * 6)
        assert app.focused is app.query_one("#set-microbatches")
        app.focused.value = ""
        await pilot.press(*"100000", "enter")
        await settle(pilot)
        assert visible(app, "#split-editor", SMALL) and visible(app, "#settings", SMALL)
        assert "microbatches '100000' refused, kept 64" in status(app)
        await pilot.press("2")
        assert app.focused is app.query_one("#split-rows")
        assert app.query_one("#set-microbatches").value == "64"
        assert app.state.microbatches == 64
        assert "1.000x vs even" in "\n".join(screen_text(app))  # not "vs even…"


# ------------------------------------------------------------------ 2. foreign traces


async def test_a_trace_of_another_configuration_shows_no_figures() -> None:
    """Before: a pp 2 trace beside a pp 8 session showed "error -97.2 %", "ops matched
    32" and a cursor line "-77.0 %" next to "the traces differ in pp". At both sizes,
    one session resized."""
    app = PPSimApp(llama())
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.load_trace(str(ROOT / "traces/1f1b-5-3-m8/real.json"))
        for size in (SMALL, LARGE):
            await pilot.resize_terminal(*size)
            await settle(pilot)
            shown = str(app.query_one("#compare").render())
            assert "figures are hidden" in shown and "pp 2 (simulated 8)" in shown, size
            assert "error" not in shown and "matched" not in shown and "%" not in shown
            assert "figures are hidden" in status(app)
            cursor = str(app.query_one("#cursor-info").render())
            assert "real start" not in cursor and "%" not in cursor


async def test_a_trace_of_this_configuration_still_shows_its_figures() -> None:
    cfg = load_config(str(ROOT / "traces/1f1b-5-3-m8/config.toml"))
    app = PPSimApp(cfg, trace_path=str(ROOT / "traces/1f1b-5-3-m8/real.json"))
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        shown = str(app.query_one("#compare").render())
        assert "error" in shown and "ops matched" in shown and "hidden" not in shown


# ------------------------------------------------------------------ 3. zoom under key repeat


async def test_zoom_under_key_repeat_keeps_the_cursor_and_per_cell_follows() -> None:
    """Before: 50 fast `+` at pp 16 x 256 left the axis somewhere else than the cursor,
    and "per cell" in the cursor line stayed stale after `+` / `0`."""
    app = PPSimApp(llama(16, 256))
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        await pilot.press("3", "home", *["right"] * 17)
        await pilot.press("0")
        tl = app.query_one(Timeline)
        for _ in range(50):  # key repeat: every press before the next frame
            tl.action_zoom(0.5)
        await pilot.pause()
        await pilot.pause()
        op = tl.current_op()
        cell = (op.start + op.end) / 2 / tl.ms_per_cell
        assert tl.scroll_x <= cell < tl.scroll_x + tl._view_width()
        info = str(app.query_one("#cursor-info").render())
        assert tl.describe_scale() in info and tl.border_subtitle == tl.describe_scale()
        await pilot.press("0")
        await pilot.pause()
        assert tl.describe_scale() in str(app.query_one("#cursor-info").render())
        assert tl.border_subtitle == tl.describe_scale()


# ------------------------------------------------------------------ 4. messages that stay


async def test_planner_progress_counts_splits_and_its_outcome_stays(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the progress bar read `--%`; the outcome said 95/5843355957."""
    release = threading.Event()
    fake_planner(monkeypatch, release, (7, 1), evaluated=12345)
    app = PPSimApp()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("p")
        for _ in range(50):
            await pilot.pause(0.01)
            if "12,345 splits evaluated" in status(app):
                break
        assert "12,345 splits evaluated of 9 possible" in status(app)
        release.set()
        await settle(pilot)
        assert "95 of 5,843,355,957 splits" in status(app)
        assert "a accepts" in status(app)


async def test_no_split_fits_stays_with_the_lowest_peak_and_what_to_try(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "the planner found no split that fits memory" was a toast gone in ~5 s,
    without the lowest peak, its rank or what to try (the CLI gives them)."""
    import ppsim.tui.planning

    monkeypatch.setattr(ppsim.tui.planning, "IN_PROCESS", False)
    cfg = load_config(None)
    cfg.hardware.memory_bytes = 1e6  # 1 MB: nothing fits
    app = PPSimApp(cfg)
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot)
        text = status(app)
        assert "no split fits 1.00 MB per rank" in text and "on rank" in text
        # At 1 MB the weights alone pass the limit: the advice says recompute cannot
        # help and what can.
        assert "(recompute cannot help); try more tensor or expert parallelism" in text
        assert text.endswith("(--use-distributed-optimizer, --gpus)")
        app.query_one("#split-rows").focus()
        await pilot.press("down")  # later keys that say nothing keep it
        assert status(app) == text


async def test_a_count_input_error_is_in_view_at_160x45() -> None:
    """Before: "'abc' is not a whole number" sat below the visible part of the split
    panel (at pp 32 its rows fill it)."""
    app = PPSimApp(llama(32, 16))
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        await pilot.press("2", "c", *"abc", "enter")
        await settle(pilot)
        assert any("'abc' is not a whole number" in line for line in screen_text(app))
        assert "'abc' is not a whole number" in status(app)


# ------------------------------------------------------------------ 5. plan -> compare -> accept


async def test_a_split_nudge_while_planning_keeps_the_result_as_a_proposal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: nudging the split while the planner ran threw its result away ("the
    settings changed while it ran"), though the planner replaces the split anyway."""
    release = threading.Event()
    fake_planner(monkeypatch, release, (7, 1))
    app = PPSimApp()
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await pilot.pause()
        await pilot.press("left")  # only the split: (5, 3)
        await pilot.pause()
        release.set()
        await settle(pilot)
        assert app.state.counts == (5, 3)  # a proposal, not applied behind the user's back
        shown = str(app.query_one("#proposal").render())
        assert "planner [7, 1]" in shown and "a accept" in shown
        await pilot.press("a")
        await settle(pilot)
        assert app.state.counts == (7, 1)
        assert not app.query_one("#proposal").display
        await pilot.press("u")
        await settle(pilot)
        assert app.state.counts == (5, 3)


async def test_a_proposal_can_be_dismissed_and_a_settings_change_drops_the_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    fake_planner(monkeypatch, release, (7, 1))
    app = PPSimApp()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("p")
        release.set()
        await settle(pilot)
        assert app.proposal is not None
        # the proposal's timing whole at 80 columns (it was cut: "(-14.497 ms vs curre…")
        assert any("ms vs current)" in line for line in screen_text(app))
        await pilot.press("x")
        assert app.proposal is None and app.state.counts == (6, 2)
        release.clear()
        await pilot.press("p")
        await pilot.pause()
        inp = app.query_one("#set-microbatches")
        inp.focus()
        inp.value = "16"
        await pilot.press("enter")
        release.set()
        await settle(pilot)
        assert app.proposal is None and "planner result dropped" in status(app)


async def test_a_typed_layout_can_be_pinned() -> None:
    app = PPSimApp(llama())
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        app.pin_text("Et*11|(t*10|)*6t*9L")
        await settle(pilot)
        assert app.result.pinned_counts == (11, 10, 10, 10, 10, 10, 10, 9)
        assert "pinned: [11, 10, 10, 10, 10, 10, 10, 9]" in "\n".join(screen_text(app))
        app.pin_text("1,2,3")
        await settle(pilot)
        assert "pin refused" in status(app)
        assert app.result.pinned_counts == (11, 10, 10, 10, 10, 10, 10, 9)
