"""Pilot tests: the real app, headless, driven by keys and clicks."""

from __future__ import annotations

import io
import json
import shlex
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from ppsim.cli.main import main as ppsim_main
from ppsim.config.model import parse_model
from ppsim.config.schema import load_config
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.tui.app import PPSimApp
from ppsim.tui.exports import megatron_to_ppsim_args, read_export
from ppsim.tui.memory import MemoryBars
from ppsim.tui.session import config_for, planner_available
from ppsim.tui.testing import (
    SIZE,
    preset_on_default,
    screen_text,
    settle,
    settle_until,
    status_text,
)
from ppsim.tui.timeline import Timeline
from ppsim.units import fmt_bytes


def reference(counts: tuple[int, ...]):
    """What `ppsim simulate` gives for the default config with this split."""
    cfg = load_config(None)
    cfg.pipeline.split = list(counts)
    return simulate(build_problem(cfg)).summary


def assert_shows(app: PPSimApp, counts: tuple[int, ...]) -> None:
    ref = reference(counts)
    assert app.state.counts == counts
    assert app.result is not None and app.result.state.counts == counts
    assert app.result.sim.summary == ref
    text = "\n".join(screen_text(app))
    assert f"iteration {ref.iteration_time_ms:.3f} ms" in text
    assert f"split={list(counts)}" in text
    bars = app.query_one(MemoryBars).bars
    assert [b.peak_bytes for b in bars] == [r.peak_memory_bytes for r in ref.ranks]
    assert [b.static_bytes for b in bars] == [r.static_bytes for r in ref.ranks]
    for r in ref.ranks:
        assert fmt_bytes(r.peak_memory_bytes) in text
    tl = app.query_one(Timeline)
    assert tl.end_ms == pytest.approx(ref.iteration_time_ms)


async def test_startup_shows_the_default_simulation() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert_shows(app, (6, 2))


async def test_moving_a_boundary_resimulates_and_undo_restores() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("right")  # stage 0 takes a layer from stage 1
        await settle(pilot)
        assert_shows(app, (7, 1))
        await pilot.press("left", "left", "left")
        await settle(pilot)
        assert_shows(app, (4, 4))
        await pilot.press("u")
        await settle(pilot)
        assert_shows(app, (5, 3))
        await pilot.press("u", "u", "u")
        await settle(pilot)
        assert_shows(app, (6, 2))
        await pilot.press("ctrl+y")
        await settle(pilot)
        assert_shows(app, (7, 1))


async def test_refused_boundary_move_shows_an_error() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press(*["right"] * 5)  # stage 1 runs out of layers after 3
        await settle(pilot)
        assert app.state.counts == (8, 0)
        await pilot.press("down", "left")  # the empty last stage has nothing to give
        await settle(pilot)
        assert app.state.counts == (8, 0)
        assert "stage 1 has only 0 layer(s) to give" in "\n".join(screen_text(app))
        await pilot.press("right")  # the last stage grows at its start
        await settle(pilot)
        assert_shows(app, (7, 1))
        assert "to give" not in "\n".join(screen_text(app))


async def test_mouse_click_moves_a_boundary() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        rows = app.query_one("#split-rows")
        # row 1 (stage 0), far right of the layer bar = the last layer
        await pilot.click(rows, offset=(rows.size.width - 1, 1))
        await settle(pilot)
        assert_shows(app, (8, 0))  # its end boundary moves past the last layer


async def test_typing_a_count() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("c", "2", "enter")
        await settle(pilot)
        assert_shows(app, (2, 6))
        assert app.focused is app.query_one("#split-rows")  # Enter left the field
        await pilot.press("c", "x", "enter")
        await settle(pilot)
        assert app.state.counts == (2, 6)
        assert "'x' is not a whole number" in "\n".join(screen_text(app))


REFUSED = [
    ("microbatches", "0", "must be at least 1"),
    ("pp", "abc", "'abc' is not a whole number"),
    ("pp", "1000000000", "above the limit"),
    ("microbatches", "1000000000", "above the limit"),
    ("microbatches", "100000", "more than the TUI handles"),
    ("memory_gb", "lots", "not a number"),
    ("memory_gb", "inf", "finite"),
]
"""(field, text typed, what the status line says): each refused, in one app session
(a refusal leaves the state as it was, so each case starts where the last left it)."""


async def test_a_refused_value_reverts_and_says_why() -> None:
    """Issue 12 defect 4: a refused value does not stay in its field while the
    headline shows the old one; the field goes back to the simulated value."""
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        before, result = app.state, app.result
        for field, text, error in REFUSED:
            inp = app.query_one(f"#set-{field}")
            inp.focus()
            inp.value = ""
            await pilot.press(*text, "enter")
            await settle(pilot)
            assert app.state == before and app.result is result, (field, text)
            assert not app.history.can_undo
            said = app.query_one("#status").text
            assert error in said, (field, text, said)
            assert inp.value == {"pp": "2", "microbatches": "8", "memory_gb": "16"}[field]
            assert f"refused, kept {inp.value}" in said


async def test_changing_vpp_switches_schedule_and_resplits() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        inp = app.query_one("#set-vpp")
        inp.focus()
        inp.value = "2"
        await pilot.press("enter")
        await settle(pilot)
        s = app.state
        assert (s.vpp, s.schedule, s.counts) == (2, "interleaved-1f1b", (2, 2, 2, 2))
        cfg = load_config(None)
        cfg.pipeline.vpp, cfg.pipeline.schedule, cfg.pipeline.split = 2, "interleaved-1f1b", \
            [2, 2, 2, 2]
        assert app.result.sim.summary == simulate(build_problem(cfg)).summary
        assert "interleaved-1f1b" in "\n".join(screen_text(app))


async def test_export_writes_flags_that_ppsim_split_parses_back(tmp_path: Path) -> None:
    app = PPSimApp()
    out = tmp_path / "split.sh"
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("right")  # (7, 1)
        await settle(pilot)
        await pilot.press("e")
        await pilot.pause()
        prompt = app.screen.query_one("#prompt-input")
        prompt.value = str(out)
        await pilot.press("enter")
        await settle(pilot)
    forms = read_export(out.read_text())
    flags = shlex.split(forms["MEGATRON_ARGS"])
    assert "--decoder-first-pipeline-num-layers" in flags or \
        "--pipeline-model-parallel-layout" in flags
    for key in ("MEGATRON_ARGS", "MEGATRON_LAYOUT_ARGS"):
        args = megatron_to_ppsim_args(shlex.split(forms[key]))
        if "--num-layers" not in args:
            args += ["--num-layers", "8", "--pp", "2"]
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert ppsim_main(["split", "--json", *args]) == 0
        parsed = json.loads(buf.getvalue())
        assert [st["layers"] for st in parsed["stages"]] == [7, 1]
    assert json.loads(forms["TORCHTITAN_FQNS"])[1] == ["layers.7", "norm", "lm_head"]
    assert json.loads(forms["DEEPSPEED_BOUNDARIES"]) == [0, 8, 10]


async def test_save_config_round_trips(tmp_path: Path) -> None:
    app = PPSimApp()
    out = tmp_path / "saved.toml"
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("left")
        await settle(pilot)
        await pilot.press("s")
        await pilot.pause()
        app.screen.query_one("#prompt-input").value = str(out)
        await pilot.press("enter")
        await settle(pilot)
        expected = config_for(app.base, app.state)
    assert load_config(str(out)) == expected
    assert load_config(str(out)).pipeline.split == [5, 3]


@pytest.mark.skipif(not planner_available(), reason="ppsim.planner is not written yet")
async def test_planner_lands_on_the_best_split() -> None:
    from ppsim.plan.planner import plan

    best = plan(build_problem(load_config(None))).best
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle_until(pilot, lambda: app.planning is None)
        assert app.plan_result is not None, status_text(app)
        assert app.proposal.counts == best.split.counts  # a proposal: a accepts it
        await pilot.press("a")
        await settle(pilot)
        assert app.state.counts == best.split.counts
        assert app.result.sim.summary.iteration_time_ms == pytest.approx(
            best.summary.iteration_time_ms)
        assert_shows(app, best.split.counts)


async def test_planner_missing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import ppsim.tui.planning

    monkeypatch.setattr(ppsim.tui.planning, "planner_available", lambda: False)
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot)
        assert app.state.counts == (6, 2)
        assert any("planner not available" in str(n.message) for n in app._notifications)


def make_trace(path: Path, split: str) -> None:
    with redirect_stdout(io.StringIO()):
        assert ppsim_main(["simulate", "--split", split, "--trace", str(path)]) == 0


async def test_loading_a_trace_shows_the_comparison(tmp_path: Path) -> None:
    trace = tmp_path / "real.json"
    make_trace(trace, "4,4")  # a "real" run with another split
    app = PPSimApp(trace_path=str(trace))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        cmp = app.comparison
        assert cmp is not None and cmp.hidden  # issue 26: another split, no figures
        text = "\n".join(screen_text(app))
        assert "split [4, 4] (simulated [6, 2])" in text and "error" not in text
        labels = [lane.label for lane in app.query_one(Timeline).lanes]
        assert labels == ["r0", "real0", "r1", "real1"]  # each real lane under its rank
        # move to the trace's split: the comparison follows the re-simulation
        await pilot.press("left", "left")
        await settle(pilot)
        cmp = app.comparison
        real = reference((4, 4)).iteration_time_ms
        assert not cmp.hidden and cmp.real_ms == pytest.approx(real, rel=1e-6)
        assert cmp.matched == 32 and cmp.sim_only == 0 and cmp.real_only == 0
        assert cmp.rel_error == pytest.approx(0.0, abs=1e-9)
        text = "\n".join(screen_text(app))
        # issue 12 defect 5: ppsim diff's sign, (real - sim) / sim, and the iteration
        assert f"real {real:.3f} ms" in text and f"error {0:+.1%}" in text
        assert "real iteration 0 compared" in text


async def test_loading_a_trace_from_the_prompt(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    make_trace(trace, "6,2")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("t")
        await pilot.pause()
        app.screen.query_one("#prompt-input").value = str(bad)
        await pilot.press("enter")
        await settle(pilot)
        assert app.trace is None and "cannot load trace" in "\n".join(screen_text(app))
        await pilot.press("t")
        await pilot.pause()
        app.screen.query_one("#prompt-input").value = str(trace)
        await pilot.press("enter")
        await settle(pilot)
        assert app.comparison is not None and app.comparison.rel_error == pytest.approx(0.0)


async def test_timeline_cursor_zoom_and_scroll() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tl = app.query_one(Timeline)
        tl.focus()
        await pilot.pause()
        ops = app.result.sim.timeline.ops
        await pilot.press("right", "right")
        await pilot.pause()
        op = ops[0][2]
        info = str(app.query_one("#cursor-info").render())
        assert f"r0 {op.action.kind}{op.action.microbatch} chunk 0 stage 0" in info
        assert f"start {op.start:.3f} ms dur {op.end - op.start:.3f} ms" in info
        await pilot.press("down")
        await pilot.pause()
        assert tl.cursor[0] == 1
        fit = tl.ms_per_cell
        await pilot.press("plus", "plus", "plus")
        await pilot.pause()
        assert tl.ms_per_cell == pytest.approx(fit / 8)
        await pilot.press("end")
        await pilot.pause()
        assert tl.scroll_x > 0  # the cursor's op is kept in view
        await pilot.press("0")
        await pilot.pause()
        assert tl.ms_per_cell == pytest.approx(fit) and tl.scroll_x == 0


async def test_big_timeline_renders_only_visible_lines() -> None:
    app = PPSimApp(preset_on_default("llama3-70b", 16, 256))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("C")  # the preset's tp collectives' lanes hidden
        await settle(pilot)
        tl = app.query_one(Timeline)
        assert len(tl.lanes) == 16 and sum(len(lane.ops) for lane in tl.lanes) == 8192
        tl.focus()
        for _ in range(5):
            await pilot.press("plus")
        await pilot.pause()
        tl.lines_rendered = 0
        await pilot.press("plus")  # a new zoom: every visible line is built afresh
        await pilot.pause()
        # at most twice the visible lines: once at the new scale, once re-centred
        assert 0 < tl.lines_rendered <= 2 * tl.size.height
        before = tl.lines_rendered
        tl.refresh()  # nothing changed: every line comes from the cache
        await pilot.pause()
        assert tl.lines_rendered == before


async def test_help_screen_and_command_palette_commands() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert "ppsim tui" in "\n".join(screen_text(app))
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("f1", "f1")  # f1 closes the help it opened, as ? does
        await pilot.pause()
        assert app.screen is app.screen_stack[0]
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for t in ("Plan", "Export split", "Save config", "Load trace", "Undo", "Help"):
            assert t in titles


async def test_select_a_schedule_then_undo_restores_the_settings() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.query_one("#set-schedule").value = "gpipe"
        await settle(pilot)
        assert app.state.schedule == "gpipe"
        cfg = load_config(None)
        cfg.pipeline.schedule = "gpipe"
        assert app.result.sim.summary == simulate(build_problem(cfg)).summary
        app.query_one("#split-rows").focus()
        await pilot.press("u")
        await settle(pilot)
        assert app.state.schedule == "1f1b"
        assert app.query_one("#set-schedule").value == "1f1b"
        assert_shows(app, (6, 2))
        # letters typed into a field go to the field, not to the app's bindings
        inp = app.query_one("#set-microbatches")
        inp.focus()
        await pilot.press("u")
        assert inp.value.endswith("u") and app.state.schedule == "1f1b"


async def test_a_model_preset_too_big_for_memory_shows_over_limit() -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.query_one("#set-model").value = "llama3-70b"
        await settle(pilot)
        assert sum(app.state.counts) == 80 and app.state.counts == (40, 40)
        s = app.result.sim.summary
        assert not s.fits  # 70B on two 16 GB CPU ranks
        text = "\n".join(screen_text(app))
        assert "NO SPLIT FITS" in text and "OVER" in text


async def test_many_stages_keep_the_selected_row_in_view() -> None:
    cfg = load_config(None)
    cfg.model = parse_model({"preset": "gpt3-175b"})
    cfg.pipeline.pp, cfg.pipeline.vpp, cfg.pipeline.schedule = 16, 2, "interleaved-1f1b"
    cfg.pipeline.microbatches, cfg.pipeline.split = 32, None
    app = PPSimApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert len(app.state.counts) == 32
        await pilot.press(*["down"] * 31, "left")
        await settle(pilot)
        assert app.state.counts[31] == 2 and app.state.counts[30] == 4
        editor = app.query_one("#split-editor")
        assert editor.scroll_y > 0
        assert "  31 r15 c1    2" in "\n".join(screen_text(app))


RECORDED = sorted((Path(__file__).parents[2] / "traces").glob("*/real.json"))


@pytest.mark.skipif(not RECORDED, reason="no recorded traces in traces/ yet")
@pytest.mark.parametrize("path", RECORDED[:2], ids=lambda p: p.parent.name)
async def test_recorded_traces_load_beside_the_simulation(path: Path) -> None:
    """A real trace from traces/, opened on the config it was recorded with."""
    from ppsim.trace.read import read_trace

    trace = read_trace(str(path))
    info = trace.info
    cfg = load_config(None)
    for key in ("pp", "vpp", "microbatches", "schedule"):
        if key in info:
            setattr(cfg.pipeline, key, info[key])
    if "split" in info:
        cfg.pipeline.split = list(info["split"])
    try:
        build_problem(cfg)
    except Exception:
        pytest.skip(f"{path.name} was not recorded on the default model")
    app = PPSimApp(cfg, trace_path=str(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        cmp = app.comparison
        assert cmp is not None and cmp.real_ms > 0 and cmp.matched > 0
        assert f"real {cmp.real_ms:.3f} ms" in "\n".join(screen_text(app))
