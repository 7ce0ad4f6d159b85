"""Keys with nothing to act on, or whose effect may be off screen, say what they did
on the status line: x with no proposal, n before any find, v (the pinned lanes)."""

from __future__ import annotations

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import preset_config, settle, status_text


async def test_x_n_and_v_say_what_they_did() -> None:
    app = PPSimApp(preset_config("llama3-70b", 8, 32))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("x")
        await settle(pilot)
        assert "no planner proposal" in status_text(app)
        await pilot.press("n")
        await settle(pilot)
        assert "/ finds" in status_text(app)
        await pilot.press("v")
        await settle(pilot)
        assert "even split's lanes" in status_text(app) and "shown" in status_text(app)
        assert any(lane.source == "pinned" for lane in app.query_one("#timeline").lanes)
        await pilot.press("right", "b", "v")  # pinned: the overlay goes, named so
        await settle(pilot)
        assert "pinned split [11, 9, 10" in status_text(app), status_text(app)
        assert "hidden" in status_text(app)
        assert not any(lane.source == "pinned" for lane in app.query_one("#timeline").lanes)
