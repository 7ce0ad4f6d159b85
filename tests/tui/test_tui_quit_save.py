"""Quitting with unsaved edits: `s` in the prompt saves first, then quits; a save that
is refused keeps the app open with the reason on the status line."""

from __future__ import annotations

from pathlib import Path

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import settle, status_text


async def _quit_saving_to(pilot, app: PPSimApp, path: Path) -> None:
    await settle(pilot)
    await pilot.press("right")  # an edit: quitting asks
    await settle(pilot)
    await pilot.press("q", "s")
    await pilot.pause()
    app.screen.query_one("#prompt-input").value = str(path)
    await pilot.press("enter")
    await pilot.pause()


async def test_s_in_the_quit_prompt_saves_then_quits(tmp_path: Path) -> None:
    app = PPSimApp()
    target = tmp_path / "edited.toml"
    async with app.run_test(size=(80, 24)) as pilot:
        await _quit_saving_to(pilot, app, target)
        assert not app.is_running, status_text(app)
    assert "split" in target.read_text()


async def test_a_refused_save_in_the_quit_prompt_stays(tmp_path: Path) -> None:
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await _quit_saving_to(pilot, app, tmp_path / "missing" / "edited.toml")
        assert app.is_running
        assert "cannot save" in status_text(app) and "does not exist" in status_text(app)
