"""`P`, the memory-policy search, runs in the planner process (ppsim.tui.plan_child) as
`p` does: Escape kills it at once (a thread would have run on to its budget, taking the
GIL from the screen), and its answer is the one `plan_policy` gives in this process."""

from __future__ import annotations

import pickle
import subprocess
import time

import pytest

import ppsim.tui.planning
from ppsim.tui import policy_actions
from ppsim.tui.app import PPSimApp
from ppsim.tui.policy_plan import plan_policy
from ppsim.tui.session import state_from_config
from ppsim.tui.testing import preset_config, settle, settle_until, status_text


def recorded_children(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen]:
    """The planner processes the app starts, in order."""
    started: list[subprocess.Popen] = []
    start = ppsim.tui.planning.start_child

    def record(*args):
        started.append(start(*args))
        return started[-1]

    monkeypatch.setattr(ppsim.tui.planning, "start_child", record)
    return started


async def wait_for(pilot, done, timeout_s: float) -> bool:
    """Pause the app until `done()` holds or `timeout_s` passed; whether it holds."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    return done()


def test_a_policy_plan_pickles() -> None:
    """The answer crosses the pipe: the policy's pricing is no closure."""
    cfg = preset_config("llama3-70b", 4, 8)
    best = plan_policy(cfg, state_from_config(cfg), budget_s=1.0)
    back = pickle.loads(pickle.dumps(best))
    assert back.result.best == best.result.best and back.policies == best.policies


async def test_escape_kills_the_policy_planner_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_actions, "BUDGET_S", 60.0)  # it would run a minute
    started = recorded_children(monkeypatch)
    # A search that runs ~10 s: llama3-70b on 4 stages is proven in half a second, over
    # before a loaded machine's screen sees the process start.
    app = PPSimApp(preset_config("llama3.1-405b", 32, 64))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("P")
        assert await wait_for(pilot, lambda: bool(started), 10), "no planner process"
        proc = started[0]
        assert proc.poll() is None  # searching
        assert status_text(app).endswith("(Esc stops it)")
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: proc.poll() is not None, 2.0), \
            "the policy planner's process outlived Escape"
        assert app.planning is None and "policy planner cancelled" in status_text(app)
        await settle(pilot)
        assert app.proposal is None


async def test_the_policy_planner_process_proposes_what_plan_policy_plans(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """llama3-70b on 4 stages: the per-stage search is proven within its budget, so the
    answer does not depend on how fast either search ran."""
    started = recorded_children(monkeypatch)
    cfg = preset_config("llama3-70b", 4, 8)
    app = PPSimApp(cfg)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        state = app.state
        await pilot.press("P")
        await settle_until(pilot, lambda: app.planning is None)
        assert len(started) == 1 and started[0].poll() is not None
        here = plan_policy(app.base, state)
        assert here.proven, "the comparison needs a proven answer"
        prop = app.proposal
        assert prop is not None, status_text(app)
        assert prop.counts == tuple(here.result.best.split.counts)
        assert prop.policies == tuple(here.policies)
        assert app.plan_result.best.summary == here.result.best.summary
        assert "policy planner (per-stage)" in status_text(app)
        assert "proven optimal" in status_text(app)


async def test_the_policy_planner_processs_answer_for_old_settings_is_dropped() -> None:
    """A setting changed while the process searched: its answer is not proposed."""
    from ppsim.tui.messages import SettingChanged

    app = PPSimApp(preset_config("llama3-70b", 4, 8))
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        await pilot.press("P")
        await pilot.pause()
        app.post_message(SettingChanged("recompute", "full"))
        await settle_until(pilot, lambda: app.planning is None)
        assert app.state.recompute == "full" and app.proposal is None
        assert any("policy plan dropped" in str(n.message) for n in app._notifications)
