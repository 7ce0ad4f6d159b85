"""The planner's proposal and the settings: a proposal is for the settings it was
planned with; accepting it never puts back settings changed since."""

from __future__ import annotations

import pytest

from ppsim.tui.app import PPSimApp
from ppsim.tui.session import apply_setting, planner_available
from ppsim.tui.testing import screen_text, settle, settle_until, status_text

pytestmark = pytest.mark.skipif(not planner_available(), reason="no planner")


async def _planned(pilot, app: PPSimApp) -> None:
    """The app settled, the planner run with `p` and finished."""
    await settle(pilot)
    await pilot.press("p")
    await settle_until(pilot, lambda: app.planning is None)


async def test_accepting_a_proposal_keeps_settings_changed_after_it() -> None:
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await _planned(pilot, app)
        assert app.proposal is not None, status_text(app)
        mb = app.state.microbatches * 2
        app.set_state(apply_setting(app.base, app.state, "microbatches", str(mb)),
                      field="microbatches")
        await pilot.press("a")
        await settle(pilot)
        assert app.state.microbatches == mb
        assert app.result.state.microbatches == mb
        assert app.proposal is None


async def test_a_proposal_for_other_settings_is_dropped_from_the_screen() -> None:
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await _planned(pilot, app)
        app.set_state(apply_setting(app.base, app.state, "memory_gb", "1"), field="memory_gb")
        await settle(pilot)
        assert "proposal dropped" in status_text(app)
        assert "a accept" not in "\n".join(screen_text(app))
        await pilot.press("a")
        await settle(pilot)
        assert app.state.memory_bytes == 1e9


async def test_a_proposal_stands_while_only_the_split_changes() -> None:
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await _planned(pilot, app)
        proposed = app.proposal.counts
        await pilot.press("right")  # stage 0 one layer more
        await settle(pilot)
        await pilot.press("a")
        await settle(pilot)
        assert app.state.counts == proposed
