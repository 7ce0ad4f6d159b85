"""A pinned split belongs to the pipeline shape it was pinned on: in another shape
(one whose stage count happens to match included) the even split is compared."""

from __future__ import annotations

from ppsim.tui.app import PPSimApp
from ppsim.tui.compare import delta_lines
from ppsim.tui.session import apply_setting
from ppsim.tui.testing import settle


async def setting(app: PPSimApp, pilot: object, name: str, text: str) -> None:
    app.set_state(apply_setting(app.base, app.state, name, text), field=name)
    await settle(pilot)


async def test_a_split_pinned_at_pp4_is_not_compared_at_pp2_vpp2() -> None:
    app = PPSimApp()  # tiny-llm, 8 layers
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await setting(app, pilot, "pp", "4")
        await pilot.press("right")  # stage 0 one layer more
        await settle(pilot)
        pinned = app.state.counts
        await pilot.press("b")
        await settle(pilot)
        assert app.result.pinned_counts == pinned and not app.result.pinned_is_even
        await setting(app, pilot, "pp", "2")
        await setting(app, pilot, "vpp", "2")
        assert (app.state.pp, app.state.vpp, len(app.state.counts)) == (2, 2, len(pinned))
        assert app.result.pinned_is_even
        assert app.result.pinned_counts != pinned
        assert "even" in delta_lines(app.result)[0]
        await setting(app, pilot, "vpp", "1")
        await setting(app, pilot, "pp", "4")  # the shape it was pinned on: compared again
        assert app.result.pinned_counts == pinned

