"""The memory policy in the split editor, driven as a user would at 80x24 and
160x45: keys edit the selected stage's policy, the simulation, memory bars and
timeline (host-copy lanes) follow, and `P` proposes a split with a policy that
`a` accepts and `x` dismisses."""

from __future__ import annotations

import re

import pytest

from ppsim.policy.report import stage_policies as problem_policies
from ppsim.tui.app import PPSimApp
from ppsim.tui.memory import MemoryBars
from ppsim.tui.testing import preset_config, screen_text, settle, status_text
from ppsim.tui.timeline import Timeline

SIZES = [(80, 24), (160, 45)]
"""Both checked in one session each: started at one, resized to the other."""


@pytest.fixture
def quick_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy planner with a 1 s budget instead of 5: what these tests check (a
    proposal made, accepted or dismissed) does not need its best answer."""
    from ppsim.tui import policy_actions

    monkeypatch.setattr(policy_actions, "BUDGET_S", 1.0)


def llama() -> PPSimApp:
    return PPSimApp(preset_config("llama3-70b", 4, 8))


def policy_on_screen(app: PPSimApp) -> str:
    """The selected stage's policy as the split panel shows it (its line, and the
    offload line under it where the panel is narrow)."""
    screen = screen_text(app)
    at = [i for i, line in enumerate(screen)
          if re.search(r"(stage \d+ recompute|s\d+ rc )", line)]
    assert at, "no policy line on screen"
    nxt = screen[at[0] + 1] if at[0] + 1 < len(screen) else ""
    return screen[at[0]] + (nxt if "   off " in nxt else "")


async def test_policy_keys_edit_the_selected_stage_and_the_memory_follows() -> None:
    """Edited at 80x24; the same session resized to 160x45 shows the edits too."""
    app = llama()
    async with app.run_test(size=SIZES[0]) as pilot:
        await settle(pilot)
        assert "core_attn" in policy_on_screen(app)  # selective: core_attn everywhere
        peak = app.query_one(MemoryBars).bars[0].peak_bytes
        await pilot.press("]", "]")  # stage 0: its first 2 layers recomputed whole
        await settle(pilot)
        assert app.state.policies[0].recompute_layers == 2
        assert [d["recompute_layers"] for d in problem_policies(app.result.sim.problem)] \
            == [2, 0, 0, 0]
        assert "N 2/20" in policy_on_screen(app) or "N2/20" in policy_on_screen(app)
        assert app.query_one(MemoryBars).bars[0].peak_bytes < peak
        await pilot.press("down", "m")  # stage 1: the next module set (a dense Llama
        await settle(pilot)  # layer's norms are fused into its linears: no layernorm)
        assert app.state.policies[1].recompute_modules == ("mlp",)
        for size in SIZES:
            await pilot.resize_terminal(*size)
            await settle(pilot)
            assert "mlp" in policy_on_screen(app), size
            # the row's letter: stage 0 recomputes its first N layers ("E" embedding, no "!")
            assert any("r0  c0" in line and "E  N" in line for line in screen_text(app)), size
        await pilot.press("u")  # undo takes the policy edit back
        await settle(pilot)
        assert app.state.policies[1].recompute_modules == ("core_attn",)


async def test_offload_draws_the_host_copies_under_the_rank() -> None:
    """Offloaded at 80x24; the same session resized to 160x45 draws it too."""
    app = llama()
    async with app.run_test(size=SIZES[0]) as pilot:
        await settle(pilot)
        await pilot.press("C")  # the preset's tp collectives' lanes hidden
        await settle(pilot)
        assert [lane.label for lane in app.query_one(Timeline).lanes] == \
            ["r0", "r1", "r2", "r3"]
        await pilot.press("down", "o")
        await settle(pilot)
        assert app.state.policies[1].offload_modules == ("core_attn", "attn_proj")
        for size in SIZES:
            await pilot.resize_terminal(*size)
            await settle(pilot)
            labels = [lane.label for lane in app.query_one(Timeline).lanes]
            assert labels == ["r0", "r1", "out1", "in1", "r2", "r3"], size
            assert "offload 100% core_attn" in policy_on_screen(app) or \
                "off 100% core_attn" in policy_on_screen(app)  # ",attn_proj" cut at 80
            timeline = "\n".join(app.query_one(Timeline).text_lines())
            assert "out1" in timeline and "in1" in timeline, size
        await pilot.press("F", "F")
        await settle(pilot)
        assert app.state.policies[1].offload_fraction == 0.5
        copied = sum(c.nbytes for c in app.result.sim.timeline.copies)
        await pilot.press("f")
        await settle(pilot)
        assert sum(c.nbytes for c in app.result.sim.timeline.copies) > copied


async def test_a_refused_policy_key_says_why_and_changes_nothing() -> None:
    app = llama()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        before = app.state
        await pilot.press("f")  # no offload modules yet
        await settle(pilot)
        assert app.state == before
        assert "offloads no modules" in status_text(app)


async def test_the_recompute_setting_puts_every_stage_back_on_its_mode() -> None:
    app = llama()
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        await pilot.press("]")
        await settle(pilot)
        assert app.state.policies
        from ppsim.tui.messages import SettingChanged

        app.post_message(SettingChanged("recompute", "full"))
        await settle(pilot)
        assert app.state.policies == () and app.state.recompute == "full"
        assert "N all/20" in policy_on_screen(app)


async def test_the_policy_planner_proposes_and_a_accepts_split_and_policy(
        quick_planner) -> None:
    """Proposed at 160x45 (the proposal's rows in the split panel), shown at 80x24 too,
    accepted there."""
    app = llama()
    async with app.run_test(size=SIZES[1]) as pilot:
        await settle(pilot)
        await pilot.press("]")  # an explicit policy: the planner's prices apply
        await settle(pilot)
        await pilot.press("P")
        await settle(pilot)
        prop = app.proposal
        assert prop is not None and len(prop.policies) == 4
        assert "policy planner (per-stage)" in status_text(app)
        assert any("policy s0" in line for line in screen_text(app))
        planned = app.plan_result.best.summary.iteration_time_ms
        await pilot.resize_terminal(*SIZES[0])
        await settle(pilot)
        assert app.proposal is prop and "policy planner (per-stage)" in status_text(app)
        await pilot.press("a")
        await settle(pilot)
        assert app.state.policies == prop.policies and app.state.counts == prop.counts
        # accepted: the simulation of what is shown is the planner's figure
        assert app.result.sim.summary.iteration_time_ms == pytest.approx(planned, rel=1e-9)


async def test_x_dismisses_the_policy_plan_and_keeps_the_state(quick_planner) -> None:
    app = llama()
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        before = app.state
        await pilot.press("P")
        await settle(pilot)
        assert app.proposal is not None
        await pilot.press("x")
        await settle(pilot)
        assert app.proposal is None and app.state == before
        assert not any("policy s0" in line for line in screen_text(app))


async def test_y_copies_the_policy_flags_with_the_split() -> None:
    app = llama()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("y")
        await pilot.pause()
        assert "MEGATRON_POLICY_ARGS" not in app.clipboard  # on the recompute mode
        await pilot.press("M")  # stage 0: selective's core_attn steps back to nothing
        await settle(pilot)
        await pilot.press("y")
        await pilot.pause()
        assert "MEGATRON_ARGS=" in app.clipboard
        assert "this policy differs per stage" in app.clipboard


async def test_the_policy_letter_stands_apart_from_the_layer_kinds() -> None:
    """An MoE model's rows name their layer kinds after the policy letter: `N 12 moe`
    (it read `N12 moe`, as if 12 layers were recomputed whole)."""
    app = PPSimApp(preset_config("qwen3-30b-a3b", 4, 8))
    async with app.run_test(size=SIZES[1]) as pilot:
        await settle(pilot)
        await pilot.press("2", "]")  # stage 0: its first layer recomputed whole
        await settle(pilot)
        row = next(line for line in screen_text(app) if "   0 r0  c0" in line)
        assert re.search(r"N 12 moe ", row), row
