"""`z` gives the timeline the whole screen; a key that focuses another panel (1, 2, 4,
c) brings the panels back, so its keys never edit a panel the screen does not show."""

from __future__ import annotations

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import on_screen, preset_config, settle, status_text

SIZE = (80, 24)
KEYS = {"1": "#settings", "2": "#split-editor", "4": "#compare-box", "c": "#split-editor"}
"""A key that focuses a panel the full-screen timeline hides, and that panel."""


async def test_a_panel_key_in_full_screen_shows_the_panel_it_focuses() -> None:
    app = PPSimApp(preset_config("llama3-70b", 8, 32))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for key, panel in KEYS.items():
            await pilot.press("z")
            await settle(pilot)
            assert not on_screen(app, panel, SIZE), key
            await pilot.press(key)
            await settle(pilot)
            assert on_screen(app, panel, SIZE), (key, status_text(app))
            focused = {f"#{n.id}" for n in app.focused.ancestors_with_self}
            assert panel in focused, key


async def test_the_split_keys_in_full_screen_edit_a_split_on_screen() -> None:
    app = PPSimApp(preset_config("llama3-70b", 8, 32))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("z", "3")  # the timeline's own key keeps it full screen
        await settle(pilot)
        assert app.query_one("#timeline").region.width == SIZE[0]
        await pilot.press("2", "right")
        await settle(pilot)
        assert app.state.counts[:2] == (11, 9)
        assert on_screen(app, "#split-editor", SIZE)
