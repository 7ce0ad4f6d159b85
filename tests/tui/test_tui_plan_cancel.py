"""Escape on a running planner frees the plan keys at once: a stand-in policy search (a
thread, which cannot be stopped) is dropped, and `p` or `P` pressed next starts."""

from __future__ import annotations

import threading

import pytest

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import preset_config, settle, status_text
from tests.helpers import fake_planner


def slow_policy_planner(monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    """A policy planner that ends only when released, then answers nothing useful."""
    import ppsim.tui.planning
    from ppsim.tui import policy_actions

    def plan(base, state, budget_s):
        release.wait(30)
        raise policy_actions.UserError("stand-in", "")

    monkeypatch.setattr(policy_actions, "plan_policy", plan)
    monkeypatch.setattr(ppsim.tui.planning, "IN_PROCESS", False)  # the stand-in lives here


def said(app: PPSimApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_p_after_escaping_the_policy_planner_starts_the_split_planner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    policy_release, split_release = threading.Event(), threading.Event()
    slow_policy_planner(monkeypatch, policy_release)
    fake_planner(monkeypatch, split_release, (41, 39))
    app = PPSimApp(preset_config("llama3-70b", 2, 8))
    async with app.run_test(size=(80, 24)) as pilot:
        try:
            await _escape_p_then_p(pilot, app, policy_release, split_release)
        finally:  # the stand-ins' threads end with the test, failed or not
            policy_release.set()
            split_release.set()


async def _escape_p_then_p(pilot, app: PPSimApp, policy_release: threading.Event,
                           split_release: threading.Event) -> None:
    await settle(pilot)
    await pilot.press("P")
    await pilot.pause()
    await pilot.press("escape")
    await pilot.pause()
    assert app.planning is None and "policy planner cancelled" in status_text(app)
    await pilot.press("p")
    await pilot.pause()
    running = app.planning
    assert running is not None, status_text(app)
    assert "the planner is running" not in " ".join(said(app))
    policy_release.set()  # the dropped search ends: it leaves the split planner be
    await pilot.pause(0.3)
    assert app.planning is running and "splits evaluated" in status_text(app)
    split_release.set()
    await settle(pilot)
    assert app.planning is None and app.proposal.counts == (41, 39), status_text(app)
