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
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr("textual.app.user_downloads_path", lambda: downloads)
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        saved = await _screenshot(pilot, downloads)
        assert saved[0].read_text().startswith("<svg")
        assert status_text(app) == f"screenshot saved: {saved[0]}"
        # no Downloads folder (a server): the current folder, as `ppsim tui` was started in
        here = tmp_path / "here"
        here.mkdir()
        monkeypatch.chdir(here)
        monkeypatch.setenv("HOME", str(tmp_path / "no-such-folder"))
        assert len(await _screenshot(pilot, here)) == 1, status_text(app)


async def _screenshot(pilot, folder: Path) -> list[Path]:
    """Run the palette's Screenshot; the SVGs in `folder` once one is there."""
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*"Screenshot")
    await pilot.pause(0.3)
    await pilot.press("enter")
    for _ in range(40):
        await pilot.pause(0.05)
        if list(folder.glob("*.svg")):
            break
    await settle(pilot)
    return list(folder.glob("*.svg"))
