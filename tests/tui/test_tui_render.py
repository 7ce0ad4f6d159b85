"""Rendered-text tests: the main screen at a fixed size, compared as plain text.

Goldens are in tests/tui/golden; after an intended change of the layout,
regenerate them with `PPSIM_UPDATE_GOLDEN=1 pytest tests/tui/test_tui_render.py`
and review the diff. They depend on the Textual version (8.2.8 when written).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ppsim.config.schema import load_config
from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import SIZE, screen_text, settle

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, lines: list[str]) -> None:
    text = "\n".join(line.rstrip() for line in lines) + "\n"
    path = GOLDEN / name
    if os.environ.get("PPSIM_UPDATE_GOLDEN") or not path.exists():
        path.write_text(text, encoding="utf-8")
        if not os.environ.get("PPSIM_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden {path}; review it and rerun")
    assert text == path.read_text(encoding="utf-8")


async def test_main_screen_default() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        check_golden("main_default_120x40.txt", screen_text(app))


async def test_main_screen_after_an_edit_interleaved() -> None:
    cfg = load_config(None)
    cfg.pipeline.pp, cfg.pipeline.vpp, cfg.pipeline.schedule = 2, 2, "interleaved-1f1b"
    cfg.pipeline.split = [3, 2, 2, 1]
    app = PPSimApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("down", "left")  # stage 1 hands a layer to stage 2
        await settle(pilot)
        assert app.state.counts == (3, 1, 3, 1)
        check_golden("main_interleaved_120x40.txt", screen_text(app))


async def test_main_screen_at_80x24() -> None:
    """The narrow layout: settings column narrowed, timeline wide, global keys in the
    footer."""
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        check_golden("main_default_80x24.txt", screen_text(app))


async def test_help_screen() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        check_golden("help_120x40.txt", screen_text(app))
