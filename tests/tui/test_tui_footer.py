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
