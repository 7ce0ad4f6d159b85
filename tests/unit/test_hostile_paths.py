"""Issue 27, defect 3: an output path that is an input or another output is refused
(exit 2, naming both), and the input is left as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.errors import UserError
from ppsim.fileio import refuse_overlap


def _code(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> None:
    code, err = _code(capsys, argv)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    for w in words:
        assert w in err, err


def test_diff_png_over_a_trace_is_refused(sim_trace: str, capsys) -> None:
    before = Path(sim_trace).read_bytes()
    _refused(capsys, ["diff", sim_trace, sim_trace, "--png", sim_trace], "--png", "A.json")
    assert Path(sim_trace).read_bytes() == before


def test_diff_png_over_a_hard_link_of_the_trace_is_refused(sim_trace: str, capsys) -> None:
    link = os.path.join(os.path.dirname(sim_trace), "same.json")
    os.link(sim_trace, link)
    _refused(capsys, ["diff", sim_trace, sim_trace, "--png", link], "--png", "an input")


def test_calibrate_out_over_its_trace_is_refused(sim_trace: str, capsys) -> None:
    before = Path(sim_trace).read_bytes()
    _refused(capsys, ["calibrate", sim_trace, "--out", sim_trace], "--out", "TRACE")
    assert Path(sim_trace).read_bytes() == before


def test_simulate_trace_and_png_on_one_path_is_refused(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "o.json")
    _refused(capsys, ["simulate", "--trace", out, "--png", "./" + os.path.relpath(out)],
             "--png", "--trace", "another output")
    assert not os.path.exists(out)


def test_simulate_trace_over_the_config_is_refused(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\n')
    _refused(capsys, ["simulate", "--config", str(cfg), "--trace", str(cfg)],
             "--trace", "--config")
    assert cfg.read_text() == '[model]\npreset = "tiny-gpt"\n'


@pytest.mark.parametrize("flag", ["--trace", "--png"])
def test_simulate_output_over_the_log_it_compares_is_refused(flag: str, tmp_path: Path,
                                                            capsys) -> None:
    log = tmp_path / "train.log"
    log.write_text(" iteration       10/    1000 | elapsed time per iteration (ms): 140.5 |\n")
    before = log.read_bytes()
    _refused(capsys, ["simulate", "--compare-log", str(log), flag, str(log)], flag,
             "--compare-log")
    assert log.read_bytes() == before


def test_schedule_csv_over_the_actions_csv_is_refused(tmp_path: Path, capsys) -> None:
    csv = str(tmp_path / "o.csv")
    assert main(["schedule", "--csv", csv]) == 0
    capsys.readouterr()
    _refused(capsys, ["schedule", "--actions-csv", csv, "--csv", csv], "--csv",
             "--actions-csv")


names = st.sampled_from(["a", "b", "./a", "x/../a", "c"])


@pytest.fixture(scope="module")
def overlap_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("overlap")
    (root / "x").mkdir()  # an output's folder must exist, or it is refused for that
    return str(root)


@settings(max_examples=60, deadline=None)
@given(inputs=st.lists(names, max_size=3), outputs=st.lists(names, max_size=3))
def test_refuse_overlap_refuses_exactly_repeated_files(overlap_root: str, inputs: list[str],
                                                       outputs: list[str]) -> None:
    inputs = [os.path.join(overlap_root, p) for p in inputs]
    outputs = [os.path.join(overlap_root, p) for p in outputs]
    files = [os.path.normpath(p) for p in inputs + outputs]
    clash = any(os.path.normpath(o) in files[:len(inputs) + i]
                for i, o in enumerate(outputs))
    try:
        refuse_overlap({f"in{i}": p for i, p in enumerate(inputs)},
                       {f"out{i}": p for i, p in enumerate(outputs)})
        refused = False
    except UserError:
        refused = True
    assert refused == clash


def test_each_demo_writes_a_folder_of_its_own(tmp_path: Path, capsys) -> None:
    # A uniform model stops the demo at its first step (profile needs a transformer),
    # after it has written its config: enough to see where each demo writes.
    cfg = tmp_path / "u.toml"
    cfg.write_text('[model]\nkind = "uniform"\nnum_layers = 4\nforward_ms = 1.0\n'
                   'backward_ms = 2.0\n')
    out = tmp_path / "demo"
    for _ in range(2):
        assert main(["demo", "--out", str(out), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    # the step's own refusal, named once, not "failed: ... (run that step alone)"
    assert "demo profile: model.kind: " in err and "run that step alone" not in err, err
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(folders) == 2 and not (out / "config.toml").exists()
    assert all((f / "config.toml").exists() for f in folders)


@pytest.mark.parametrize(("argv", "flag"), [(["demo", "--out", "runs"], "--out"),
                                             (["run"], "--trace-dir")])
def test_a_file_where_the_runs_folder_goes_is_named_as_not_a_directory(
        argv, flag, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    name = argv[-1] if flag == "--out" else "ppsim-run"  # run's default folder
    (tmp_path / name).write_text("notes\n")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ppsim {argv[0]}: error: {flag}: {name} "
                                               "exists and is not a directory"), err
    assert (tmp_path / name).read_text() == "notes\n"


def test_a_demo_folder_named_like_an_option_reaches_its_steps(tmp_path: Path, capsys,
                                                              monkeypatch) -> None:
    # --out=-d: each step got "--config -d/<time>/config.toml" and refused it as an option
    # ("argument --config: expected one argument"); the step must read the config itself.
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "u.toml"
    cfg.write_text('[model]\nkind = "uniform"\nnum_layers = 4\nforward_ms = 1.0\n')
    assert main(["demo", "--out=-d", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "demo profile: model.kind: " in err and "expected one argument" not in err, err
    assert len([p for p in (tmp_path / "-d").iterdir() if p.is_dir()]) == 1
