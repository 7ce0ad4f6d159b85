"""Issue 12's defects, item 6: the command line, files and the app's edges (a missing
trace, bad values and configs, a crash's exit status, saving, quitting, the dropdowns, the
real planner's child), and issue 15 item 7, each driven as a user would.

Each test failed on the code before the fix; the comment says how.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from ppsim.cli.main import main as ppsim_main
from ppsim.config.schema import load_config
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import SIZE, preset_on_default, screen_text, settle
from ppsim.tui.timeline import Timeline

ROOT = Path(__file__).parents[2]


def text_of(app: PPSimApp) -> str:
    return "\n".join(screen_text(app))


async def test_a_missing_trace_clears_the_old_real_lanes(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    with redirect_stdout(io.StringIO()):
        assert ppsim_main(["simulate", "--trace", str(trace)]) == 0
    app = PPSimApp(trace_path=str(trace))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert any(lane.source == "real" for lane in app.query_one(Timeline).lanes)
        app.load_trace(str(tmp_path / "missing.json"))
        await settle(pilot)
        assert app.trace is None and app.comparison is None
        assert not any(lane.source == "real" for lane in app.query_one(Timeline).lanes)
        assert "cannot load trace" in text_of(app)


@pytest.mark.parametrize("argv", [["--memory-gb", "-1"], ["--memory-gb", "nan"],
                                  ["--memory-gb", "inf"], ["--microbatches", "100000"]])
def test_bad_command_line_values_exit_2_before_the_screen_opens(argv, capsys) -> None:
    assert ppsim_main(["tui", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppsim tui: error:") and err.count("\n") == 1


def test_a_trace_whose_other_data_is_a_list_exits_2(tmp_path: Path, capsys) -> None:
    """Issue 15 item 7: the app crashed on it and exited 0."""
    path = tmp_path / "t.json"
    with redirect_stdout(io.StringIO()):
        assert ppsim_main(["simulate", "--trace", str(path)]) == 0
    data = json.loads(path.read_text())
    data["otherData"] = [1, 2]
    path.write_text(json.dumps(data))
    rc = ppsim_main(["tui", "--trace", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "otherData" in err


def test_a_config_missing_seq_length_exits_non_zero(tmp_path: Path) -> None:
    """Issue 15 item 7: the app crashed inside and exited 0."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nkind = "transformer"\nnum_layers = 4\nhidden_size = 64\n'
                   'num_heads = 4\nnum_kv_heads = 4\nffn_hidden_size = 256\n'
                   'vocab_size = 100\n[pipeline]\npp = 2\n')
    proc = subprocess.run([sys.executable, "-m", "ppsim.cli", "tui", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "seq_length" in proc.stderr


async def test_a_crash_inside_the_app_sets_a_non_zero_exit_status(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ppsim.tui.child

    def boom(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ppsim.tui.child, "evaluate_state", boom)
    app = PPSimApp()
    with pytest.raises(Exception, match="a bug"):
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
    assert app.return_code == 1


def test_pp_on_the_command_line_re_splits_a_saved_split(tmp_path: Path) -> None:
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.cli.tui import resplit_note
    from ppsim.tui.session import state_from_config

    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "tiny-gpt"\n[pipeline]\npp = 2\nsplit = [5, 3]\n')
    args = build_parser().parse_args(["tui", "--config", str(path), "--pp", "4"])
    cfg = config_from_args(args)
    note = resplit_note(args, cfg)
    assert "--pp re-split the layers evenly" in note and "[5, 3]" in note
    assert state_from_config(cfg).counts == (2, 2, 2, 2)
    same = build_parser().parse_args(["tui", "--config", str(path)])
    cfg = config_from_args(same)
    assert resplit_note(same, cfg) == "" and state_from_config(cfg).counts == (5, 3)


def test_pp_3_with_llama3_70b_is_accepted_like_in_the_ui() -> None:
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.tui.session import config_for, state_from_config

    args = build_parser().parse_args(["tui", "--preset", "llama3-70b", "--pp", "3"])
    cfg = config_from_args(args)
    state = state_from_config(cfg)
    assert len(state.counts) == 3 and sum(state.counts) == 80
    build_problem(config_for(cfg, state))


def test_a_stage_without_layers_draws_idle() -> None:
    from ppsim.tui.lanes import lane_cells, sim_lanes

    cfg = load_config(None)
    cfg.pipeline.pp, cfg.pipeline.split = 3, [4, 0, 4]
    lanes = sim_lanes(simulate(build_problem(cfg)))
    middle = "".join(c.text for c in lane_cells(lanes[1], lanes[0].end / 60, 0, 60))
    assert set(middle) == {"·"}
    first = "".join(c.text for c in lane_cells(lanes[0], lanes[0].end / 60, 0, 60))
    assert set(first) != {"·"}


async def test_save_to_a_missing_folder_says_so_and_creates_nothing(tmp_path: Path) -> None:
    app = PPSimApp()
    target = tmp_path / "nope" / "c.toml"
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.save_to(str(target))
        app.export_to(str(tmp_path / "nope" / "x.sh"))
        await pilot.pause()
        msgs = [str(n.message) for n in app._notifications]
    assert not (tmp_path / "nope").exists()
    assert any("cannot save" in m and "does not exist" in m for m in msgs)
    assert not any("Errno" in m for m in msgs)


async def test_export_and_save_never_replace_what_the_app_read(tmp_path: Path) -> None:
    # Export over the loaded trace or the config replaced it with a shell script.
    trace, cfg = tmp_path / "t.json", tmp_path / "c.toml"
    with redirect_stdout(io.StringIO()):
        assert ppsim_main(["simulate", "--trace", str(trace)]) == 0
    cfg.write_text('[model]\npreset = "tiny-gpt"\n')
    before = trace.read_bytes()
    app = PPSimApp(config_path=str(cfg), trace_path=str(trace))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.export_to(str(trace))
        app.save_to(str(trace))
        app.export_to(str(cfg))
        await pilot.pause()
        refused = [str(n.message) for n in app._notifications if "never writes" in
                   str(n.message)]
        app.save_to(str(cfg))  # saving the config it was opened from is what save means
        await pilot.pause()
    assert trace.read_bytes() == before and len(refused) == 3, refused
    assert "the loaded trace" in refused[0] and "the config" in refused[2]
    assert cfg.read_text() != '[model]\npreset = "tiny-gpt"\n'


async def test_quit_with_unsaved_edits_asks(tmp_path: Path) -> None:
    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("right")
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
        assert "changed since the last save" in text_of(app)
        await pilot.press("n")
        await pilot.pause()
        assert app.is_running
        app.save_to(str(tmp_path / "c.toml"))
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_dropdowns_hold_only_real_choices() -> None:
    from textual.widgets import Select

    app = PPSimApp()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for sel in app.query(Select):
            # no blank entry ("(custom)" before) that selects nothing
            assert not sel._allow_blank and sel.value is not Select.NULL
            assert all(value is not Select.NULL for _, value in sel._options)


async def test_the_real_planner_runs_in_a_child_that_escape_stops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner process is killed on Escape (a thread could not be stopped)."""
    import ppsim.tui.planning

    started = []
    real_start = ppsim.tui.planning.start_child

    def spy(job):
        started.append(real_start(job))
        return started[-1]

    monkeypatch.setattr(ppsim.tui.planning, "start_child", spy)
    app = PPSimApp(preset_on_default("llama3-70b", 16, 256, memory_bytes=80e9))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await pilot.pause(1.0)
        assert app.planning is not None and started and started[0].poll() is None
        await pilot.press("escape")
        await settle(pilot)
        assert app.planning is None and started[0].poll() is not None
        assert any("planner cancelled" in str(n.message) for n in app._notifications)


def test_the_re_split_note_names_megatrons_per_chunk_flag_as_written(tmp_path: Path) -> None:
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.cli.tui import resplit_note
    from ppsim.tui.session import state_from_config

    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "tiny-gpt"\n[pipeline]\npp = 2\nsplit = [5, 3]\n')
    args = build_parser().parse_args(["tui", "--config", str(path),
                                      "--num-layers-per-virtual-pipeline-stage", "2"])
    cfg = config_from_args(args)
    note = resplit_note(args, cfg)
    assert "--num-layers-per-virtual-pipeline-stage re-split the layers evenly" in note
    assert state_from_config(cfg).counts == (2, 2, 2, 2)


def test_without_a_terminal_it_says_so_instead_of_drawing_into_a_pipe() -> None:
    """Off a terminal (CI, `ppsim tui | less`, input from /dev/null) it drew the screen's
    escape codes into the pipe and waited for keys that never came."""
    proc = subprocess.run([sys.executable, "-m", "ppsim.cli", "tui"], capture_output=True,
                          text=True, timeout=30, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("ppsim tui: error: tui: needs a terminal")
    assert proc.stderr.count("\n") == 1


async def test_a_start_note_alone_does_not_make_quitting_ask() -> None:
    # The hardware ppsim assumed is said on start; nothing was edited, so q quits.
    app = PPSimApp(note="assuming --hardware h100-80gb")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running
    app = PPSimApp(note="--pp re-split the layers evenly", unsaved=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
        assert app.is_running and "changed since the last save" in text_of(app)
