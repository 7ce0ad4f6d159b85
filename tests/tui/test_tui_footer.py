"""The key bar is rebuilt when the keys it shows change, and only then (tui/footer.py)."""

from __future__ import annotations

from ppsim.tui.app import PPSimApp
from ppsim.tui.footer import KeyFooter
from ppsim.tui.testing import SIZE, screen_text, settle


async def test_the_footer_is_rebuilt_only_when_its_keys_change() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        footer = app.query_one(KeyFooter)
        assert "+1 layer" in screen_text(app)[-1]  # the split rows have the focus
        app.query_one("#set-pp").focus()
        await settle(pilot)
        assert "+1 layer" not in screen_text(app)[-1] and "Undo" in screen_text(app)[-1]
        keys = list(footer.children)
        # another field of the form: the same keys, so the same widgets
        app.query_one("#set-microbatches").focus()
        await settle(pilot)
        assert list(footer.children) == keys
        assert all(a is b for a, b in zip(footer.children, keys, strict=True))
        app.query_one("#split-rows").focus()
        await settle(pilot)
        assert "+1 layer" in screen_text(app)[-1]


async def test_at_80_columns_every_key_the_footer_shows_is_whole() -> None:
    from ppsim.tui.footer import shown_keys

    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for panel in ("1", "2", "3", "4"):
            await pilot.press(panel)
            await settle(pilot)
            line = screen_text(app)[-1]
            for key in shown_keys(app.screen):
                assert key[2] in line, (panel, key[2], line)
