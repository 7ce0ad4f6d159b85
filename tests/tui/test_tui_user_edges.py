"""Edges a user hits by hand: writing to a path that is not a plain file, leaving the
count field, a boundary that does not exist. Each test failed on the code before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ppsim.config.schema import load_config
from ppsim.tui.app import PPSimApp
from ppsim.tui.editing import EditRefused, move_boundary
from ppsim.tui.files import write_problem
from ppsim.tui.session import apply_setting, state_from_config
from ppsim.tui.testing import SIZE, preset_config, settle, status_text


def test_a_symbolic_link_is_refused_before_writing(tmp_path: Path) -> None:
    target = tmp_path / "real.sh"
    target.write_text("keep\n")
    link = tmp_path / "link.sh"
    link.symlink_to(target)
    assert "symbolic link" in write_problem(str(link))
    assert write_problem(str(target)) == ""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
async def test_export_or_save_to_a_special_file_is_refused_and_the_app_keeps_running(
        tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    target = tmp_path / "real.sh"
    target.write_text("keep\n")
    link = tmp_path / "link.sh"
    link.symlink_to(target)
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.export_to(str(fifo))
        await pilot.pause()
        assert app.is_running
        assert "cannot export" in status_text(app) and "special file" in status_text(app)
        app.save_to(str(link))
        await pilot.pause()
        assert app.is_running
        assert "cannot save" in status_text(app) and "symbolic link" in status_text(app)
    assert target.read_text() == "keep\n" and link.is_symlink()


async def test_escape_in_the_count_field_drops_the_typed_count() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        before = app.state.counts
        await pilot.press("c", "5", "escape")
        await settle(pilot)
        assert app.query_one("#count-input").value == ""
        await pilot.press("c", "enter")  # a later Enter applies nothing abandoned
        await settle(pilot)
        assert app.state.counts == before


@pytest.mark.parametrize(("counts", "boundary", "words"), [
    ((6, 2), -1, "stage 0 starts at the first layer"),
    ((6, 2), 1, "stage 1 ends at the last layer"),
    ((8,), 0, "a single stage holds all the layers"),
    ((8,), -1, "a single stage holds all the layers"),
])
def test_a_boundary_that_does_not_exist_is_refused_in_the_split_s_words(
        counts: tuple[int, ...], boundary: int, words: str) -> None:
    with pytest.raises(EditRefused) as err:
        move_boundary(counts, boundary, 1)
    assert words in err.value.reason and "-1" not in err.value.reason


async def test_shift_arrows_on_the_first_stage_say_it_has_no_start_boundary() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        before = app.state.counts
        for key in ("shift+left", "shift+right"):
            await pilot.press(key)
            await settle(pilot)
            assert "stage 0 starts at the first layer" in status_text(app)
            assert "stage -1" not in status_text(app)
        assert app.state.counts == before


async def test_enter_on_the_empty_count_field_leaves_it_without_a_refusal() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        before = app.state.counts
        await pilot.press("c", "enter")
        await settle(pilot)
        assert "refused" not in status_text(app)
        assert app.focused is app.query_one("#split-rows") and app.state.counts == before


@pytest.mark.parametrize(("schedule", "vpp"), [("zbv", "3"), ("dualpipev", "1"),
                                               ("zbv", "1")])
def test_a_v_schedule_refuses_a_vpp_other_than_two_as_an_edit(schedule: str,
                                                              vpp: str) -> None:
    cfg = preset_config("llama3-8b", 4, 16, vpp=2, schedule=schedule)
    with pytest.raises(EditRefused) as err:
        apply_setting(cfg, state_from_config(cfg), "vpp", vpp)
    assert err.value.field == "vpp" and "2" in err.value.reason


def test_vpp_on_a_loop_schedule_still_changes_it() -> None:
    cfg = load_config(None)
    state = apply_setting(cfg, state_from_config(cfg), "vpp", "2")
    assert (state.vpp, state.schedule, len(state.counts)) == (2, "interleaved-1f1b", 4)


async def test_typing_vpp_3_on_zbv_is_refused_and_the_app_keeps_running() -> None:
    app = PPSimApp(config=preset_config("llama3-8b", 4, 16, vpp=2, schedule="zbv"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.query_one("#set-vpp").focus()
        app.query_one("#set-vpp").value = ""
        await pilot.press("3", "enter")
        await settle(pilot)
        assert app.is_running
        assert "vpp '3' refused" in status_text(app)
        assert (app.state.vpp, app.state.schedule) == (2, "zbv")
        assert app.query_one("#set-vpp").value == "2"


async def test_after_a_resize_the_timeline_and_compare_panel_follow_the_new_width() -> None:
    from ppsim.tui.testing import screen_text
    from ppsim.tui.timeline import Timeline

    app = PPSimApp(config=preset_config("llama3-70b", 8, 32))
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        # the border and the cursor line give the scale the timeline draws at 80 columns
        tl = app.query_one(Timeline)
        scale = tl.describe_scale()
        assert tl.border_subtitle == scale
        assert str(app.query_one("#cursor-info").render()).endswith(scale)
        # the compare panel: both lists whole, brackets kept ([10, …, 10]), none cut at
        # the panel's edge
        line = next(x for x in screen_text(app) if "current [" in x)
        assert "vs even [" in line and line.count("]") == 2, line
