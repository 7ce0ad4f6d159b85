"""The command palette's Screenshot (Textual's own command) writes an SVG of the
screen and says where in words."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import settle, status_text


async def test_the_palette_screenshot_says_where_in_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said `Saved screenshot to [$text-success]'/…/ppsim_….svg'`: markup as typed."""
    # the Downloads folder is this test's (Textual's own default patched too, so the
    # code before the fix wrote here as well)
    monkeypatch.setattr("ppsim.tui.files.user_downloads_path", lambda: tmp_path,
                        raising=False)
    monkeypatch.setattr("textual.app.user_downloads_path", lambda: tmp_path)
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Screenshot")
        await pilot.pause(0.3)
        await pilot.press("enter")
        for _ in range(40):
            await pilot.pause(0.05)
            if list(tmp_path.glob("*.svg")):
                break
        await settle(pilot)
        saved = list(tmp_path.glob("*.svg"))
        assert len(saved) == 1 and saved[0].read_text().startswith("<svg")
        assert status_text(app) == f"screenshot saved: {saved[0]}"
