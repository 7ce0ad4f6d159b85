"""Issue 26's defects 6-9 at 80x24 and 160x45: cut and unformatted text, focus and
scroll, a GPU model on the cpu preset, the README's TUI figures.

Each test failed on the code before the fix; its docstring says what happened.
"""

from __future__ import annotations

import re
from pathlib import Path

from ppsim.cli.main import build_parser
from ppsim.cli.main import main as ppsim_main
from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import on_screen, preset_config, screen_text, settle, status_text
from ppsim.tui.timeline import Timeline

ROOT = Path(__file__).parents[2]
SMALL, LARGE = (80, 24), (160, 45)
status, visible = status_text, on_screen


def llama(pp: int = 8, microbatches: int = 64):
    return preset_config("llama3-70b", pp, microbatches)


def deepseek():
    return preset_config("deepseek-v3", 16, 32, 2, "interleaved-1f1b")


# ------------------------------------------------------------------ 6. cut and unformatted text


def cut_words(lines: list[str]) -> list[str]:
    """Words the issue found cut without a mark."""
    bad = ("microbatc ", "selecte", "vs even…", "interleaved-1f1 ", "2de", "2mo")
    return [b for b in bad for line in lines if b in line + " "]


async def test_at_80x24_nothing_is_cut_without_an_ellipsis() -> None:
    """Before: `vs even…`, `microbatc`, `count layers for the selecte`, kinds
    `2de`/`2mo`, `schedule interleaved-1f1`."""
    app = PPSimApp(deepseek())
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        lines = screen_text(app)
        assert cut_words(lines) == []
        text = "\n".join(lines)
        assert "interleaved-1f1b" in text and "stage 0: 1 dense" in text


async def test_at_160x45_the_compare_line_keeps_its_brackets() -> None:
    """Before: `current [1, 2, 2, … 2, 2` ended with no bracket or ellipsis."""
    app = PPSimApp(deepseek())
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        line = next(x for x in screen_text(app) if "current [" in x)
        body = line[line.index("current ["):].split("│")[0].rstrip()
        assert body.endswith("]") or body.endswith("…"), body
        assert re.search(r"vs even split \[[^\]]*\]", body) or body.endswith("…")


def test_the_memory_delta_column_stands_apart() -> None:
    """Before: the Δ mem column ran into the peak column (`6.38 MB+856.06 kB`)."""
    from types import SimpleNamespace as NS

    from ppsim.tui.compare import delta_lines

    def summary(ms: float, peak: int):
        return NS(iteration_time_ms=ms, ranks=[NS(rank=0, busy_ms=ms, peak_memory_bytes=peak)])

    result = NS(pinned=NS(summary=summary(10.0, 5_523_940)),
                sim=NS(summary=summary(9.0, 6_380_000)), pinned_is_even=True,
                state=NS(counts=(5, 3)), pinned_counts=(4, 4))
    row = delta_lines(result, 100)[-1]
    assert "6.38 MB +856.06 kB" in row.replace("  ", " ") and "MB+" not in row


async def test_z_gives_the_timeline_the_whole_screen_and_back() -> None:
    app = PPSimApp(llama())
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        narrow = app.query_one(Timeline).size.width
        await pilot.press("z")
        await settle(pilot)
        tl = app.query_one(Timeline)
        assert not app.query_one("#left").display and tl.size.width >= SMALL[0] - 2 > narrow
        assert app.focused is tl
        assert any(line.startswith("│r7") for line in screen_text(app))
        await pilot.press("z")
        await settle(pilot)
        assert app.query_one("#left").display and visible(app, "#split-editor", SMALL)


async def test_the_help_fits_80_columns_without_ragged_wrapping() -> None:
    """Before: the help's lines were wider than the box at 80 columns and wrapped."""
    from ppsim.tui.screens import HELP

    app = PPSimApp()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        box = app.screen.query_one("#help-text")
        plain = [re.sub(r"\[/?[^\]]*\]", "", line) for line in HELP.replace("\\\n", "")
                 .splitlines()]
        assert max(len(line) for line in plain) <= box.content_region.width
        assert box.virtual_size.height <= len(plain) + 1  # no line wrapped


def test_memory_gb_refusals_name_the_label() -> None:
    from ppsim.tui.settings import field_label

    assert field_label("memory_gb") == "memory GB"


async def test_a_refused_memory_value_names_the_field_as_shown() -> None:
    """Before: errors named internal fields (`memory_gb`) instead of the label."""
    app = PPSimApp()
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        inp = app.query_one("#set-memory_gb")
        inp.focus()
        inp.value = "lots"
        await pilot.press("enter")
        await settle(pilot)
        assert status(app).startswith("memory GB 'lots' refused") and "memory_gb" not in \
            status(app)


# ------------------------------------------------------------------ 7. focus and scroll


def _background(app: PPSimApp, selector: str):
    widget = app.query_one(selector)
    return widget.styles.background


async def test_a_focused_select_stands_out() -> None:
    """Before: a focused Select differed from an unfocused one by one shade (235/234)."""
    app = PPSimApp()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.query_one("#split-rows").focus()
        await pilot.pause()
        idle = _background(app, "#set-schedule SelectCurrent")
        app.query_one("#set-schedule").focus()
        await pilot.pause()
        focused = _background(app, "#set-schedule SelectCurrent")
        r, g, b = (abs(x - y) for x, y in zip(focused.rgb, idle.rgb, strict=True))
        assert max(r, g, b) >= 40, (focused, idle)


async def test_after_a_resize_the_selected_stage_stays_in_view() -> None:
    """Before: after a resize the selected stage scrolled out of view and → edited a
    row the user could not see."""
    app = PPSimApp(llama())
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot)
        await pilot.press("2", *["down"] * 7)
        await pilot.resize_terminal(*SMALL)
        await settle(pilot)
        editor = app.query_one("#split-editor")
        row = 1 + app.query_one("#split-rows").cursor  # under the header line
        assert editor.scroll_y <= row < editor.scroll_y + editor.scrollable_content_region.height
        assert any(line.lstrip("│ ").startswith("7 r7") for line in screen_text(app))


# ------------------------------------------------------------------ 8. GPU model, cpu hardware


def test_a_gpu_model_without_hardware_is_simulated_on_an_assumed_gpu(capsys) -> None:
    """Before: `--preset deepseek-v3 --pp 16 ...` without --hardware ran on the cpu
    preset and said "iteration 170102040.041 ms", silently."""
    argv = ["simulate", "--preset", "deepseek-v3", "--pp", "16", "--vpp", "2",
            "--schedule", "interleaved-1f1b", "--microbatches", "32", "--json"]
    assert ppsim_main(argv) == 0
    out = capsys.readouterr()
    assert "assuming --hardware h100-80gb" in out.err and out.err.count("\n") == 1
    import json

    assert json.loads(out.out)["iteration_time_ms"] < 1e6
    assert ppsim_main([*argv, "--hardware", "cpu"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and json.loads(out.out)["iteration_time_ms"] > 1e6
    assert ppsim_main(["simulate", "--preset", "deepseek-v3", "--pp", "16", "--vpp", "2",
                       "--schedule", "1f1b"]) == 2
    err = capsys.readouterr().err  # bad input: still one line, the error alone
    assert err.count("\n") == 1 and "assuming" not in err and "pipeline.schedule" in err


async def test_the_tui_says_which_hardware_it_assumed() -> None:
    args = build_parser().parse_args(["tui", "--preset", "deepseek-v3", "--pp", "16",
                                      "--vpp", "2", "--schedule", "interleaved-1f1b",
                                      "--microbatches", "32"])
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.hardware_choice import assume_hardware

    cfg, note = assume_hardware(args, config_from_args(args))
    app = PPSimApp(cfg, note=note)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        assert "assuming --hardware h100-80gb" in status(app)
        assert app.state.hardware_preset == "h100-80gb"
        assert app.result.sim.summary.iteration_time_ms < 1e6


# ------------------------------------------------------------------ 9. README figures


def test_the_tui_readme_screenshot_shows_what_the_simulator_gives() -> None:
    """Before: the README's TUI figures were older than the simulator's."""
    from ppsim.pipeline.problem import build_problem
    from ppsim.sim.simulate import simulate
    from ppsim.tui.session import config_for, state_from_config

    svg = (ROOT / "tui/screenshot.svg").read_text().replace("&#160;", " ")
    text = re.sub(r"<[^>]+>", "", svg)
    m = re.search(r"pp=(\d+) vpp=(\d+) (?:microbatches|mbs|m)=(\d+)\s+split=\[([\d, …]+)\]",
                  text)
    assert m, "the screenshot names its state"
    cfg = llama(int(m.group(1)), int(m.group(3)))
    state = state_from_config(cfg)
    # The headline may cut the split; scripts/tui_screenshot.py names it whole.
    script = (ROOT / "scripts/tui_screenshot.py").read_text()
    counts = tuple(int(x) for x in re.search(r"SPLIT = \(([\d, ]+)\)", script).group(1)
                   .split(","))
    shown = [x.strip() for x in m.group(4).split(",")]
    assert [int(shown[0]), int(shown[-1])] == [counts[0], counts[-1]]
    from dataclasses import replace

    sim = simulate(build_problem(config_for(cfg, replace(state, counts=counts))))
    assert f"{sim.summary.iteration_time_ms:.3f} ms" in text
