"""A user's first session on the CLI (in-process, seconds): a config file's global batch
read by `plan --gpus` as by `simulate --gpus`, every flag's --help saying what it is,
the text timeline's legend naming every letter it draws, and Megatron's launch line
read back as the same job."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest
from helpers import run_in_process

from ppsim.cli.main import build_parser

BATCH_FILE = '[model]\npreset = "tiny-gpt"\n[pipeline]\nglobal_batch_size = 16\n'


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    return run_in_process(capsys, argv)


def test_plan_gpus_takes_the_files_global_batch(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text(BATCH_FILE)
    code, out, err = _run(capsys, ["simulate", "--config", str(cfg), "--gpus", "4", "--json"])
    assert code == 0, err
    assert json.loads(out)["job"]["global_batch_size"] == 16
    code, out, err = _run(capsys, ["plan", "--config", str(cfg), "--gpus", "4",
                                   "--time-budget", "2", "--json"])
    assert code == 0, err
    assert json.loads(out)["global_batch_size"] == 16
    # the flag still overrides the file
    code, out, err = _run(capsys, ["plan", "--config", str(cfg), "--gpus", "4",
                                   "--global-batch-size", "8", "--time-budget", "2", "--json"])
    assert code == 0, err
    assert json.loads(out)["global_batch_size"] == 8


def test_plan_gpus_without_any_batch_names_both_places(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    code, _, err = _run(capsys, ["plan", "--preset", "tiny-gpt", "--gpus", "4"])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "--global-batch-size" in err and "[pipeline] global_batch_size" in err, err


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_flag_has_help(command: str) -> None:
    parser = _commands()[command]
    bare = [a.option_strings[0] if a.option_strings else a.dest
            for a in parser._actions if not a.help]
    assert not bare, f"ppsim {command} --help says nothing of {bare}"


def test_schedule_help_lists_the_schedules() -> None:
    from ppsim.schedules.generators import SCHEDULES

    text = _commands()["simulate"].format_help()
    for name in SCHEDULES:
        assert name in text, name


def test_timeline_legend_names_lower_case(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, ["simulate", "--preset", "tiny-gpt"])
    assert code == 0, err
    cells = [line.split(None, 2) for line in out.splitlines() if line.startswith("rank ")]
    drawn = {c for f in cells if len(f) == 3 and set(f[2]) <= set("FBWfbw░.") for c in f[2]}
    assert drawn & set("fbw"), out  # the default's timeline draws odd microbatches
    legend = " ".join(out.split("timeline (", 1)[1].split("):", 1)[0].split())
    assert "lower case" in legend and "odd microbatch" in legend, legend


@pytest.mark.parametrize(("table", "example"), [("model", '"tiny-gpt"'),
                                                 ("hardware", '"h100-80gb"')])
def test_a_non_string_preset_gets_an_example_of_its_own_kind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, example: str) -> None:
    cfg = tmp_path / "job.toml"
    model = "" if table == "model" else '[model]\npreset = "tiny-gpt"\n'
    cfg.write_text(f"{model}[{table}]\npreset = 5\n")
    code, _, err = _run(capsys, ["simulate", "--config", str(cfg)])
    assert code == 2 and err.count("\n") == 1, err
    assert f"{table}.preset" in err and f"preset = {example}" in err, err


@pytest.mark.parametrize(("typed", "meant"), [
    ("--parallelism.tensor_parallel_degre", "--parallelism.tensor_parallel_degree"),
    ("--training.max_context_lenght", "--training.max_context_length"),
    ("--tensor-model-paralel-size", "--tensor-model-parallel-size")])
def test_a_misspelt_framework_flag_is_named_with_the_right_one(
        capsys: pytest.CaptureFixture[str], typed: str, meant: str) -> None:
    code, _, err = _run(capsys, ["simulate", "--preset", "tiny-gpt", typed, "2"])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"did you mean {meant}?" in err, err


def test_megatrons_launch_line_carries_the_sequence_length(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron requires --seq-length; the line `plan --gpus` prints left it out, so pasted
    back with the preset it simulated the preset's sequence, another job."""
    base = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16"]
    code, out, err = _run(capsys, ["plan", *base, "--global-batch-size", "64", "--seq-length",
                                   "16384", "--time-budget", "5", "--top", "1", "--json"])
    assert code == 0, err
    best = json.loads(out)["best"]
    assert "--seq-length 16384" in best["megatron_job_flags"]
    code, out, err = _run(capsys, ["simulate", *base, *shlex.split(best["megatron_job_flags"]),
                                   "--json"])
    assert code == 0, err
    assert json.loads(out)["iteration_time_ms"] == pytest.approx(
        best["iteration_time_ms"])


def test_simulates_headline_gives_a_small_peak_in_its_own_unit(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The default tiny model peaks at tens of MB: the headline read "0.02 GB"."""
    code, out, err = _run(capsys, ["simulate", "--preset", "tiny-gpt"])
    assert code == 0, err
    head = next(line for line in out.splitlines() if line.startswith("iteration time"))
    assert re.search(r"peak memory \d+\.\d\d MB of 16 GB", head), head
