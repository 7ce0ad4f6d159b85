"""`ppsim simulate --engine`: the simpy engine prints what the event engine prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ppsim.cli.main import main
from ppsim.sim.engines import ENGINES, simulator

CASES = [
    [],  # the embedded default
    ["--preset", "llama3-8b", "--pp", "4", "--microbatches", "8", "--schedule",
     "interleaved-1f1b", "--vpp", "2"],
    ["--devices", "0,0"],  # two ranks sharing one device
    ["--schedule", "zbv", "--vpp", "2", "--microbatches", "6"],
]


def _json(capsys, argv: list[str]) -> dict:
    assert main(["simulate", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("argv", CASES, ids=["default", "llama3-8b", "shared", "zbv"])
def test_simpy_engine_json_equals_the_event_engine(capsys, argv):
    event = _json(capsys, ["--engine", "event", *argv])
    simpy = _json(capsys, ["--engine", "simpy", *argv])
    assert simpy == event  # every key, every float, exactly
    assert _json(capsys, argv) == event  # the event engine is the default
    assert _json(capsys, ["--engine", "fast", *argv]) == event  # and "fast" names it too


def test_the_text_output_is_the_same(capsys):
    assert main(["simulate", "--engine", "simpy"]) == 0
    simpy = capsys.readouterr().out
    assert main(["simulate"]) == 0
    assert simpy == capsys.readouterr().out
    assert "iteration time" in simpy and "timeline" in simpy


def test_help_names_both_engines_and_an_unknown_one_is_refused():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--help"],
                         capture_output=True, text=True, check=True, env=env).stdout
    assert "--engine {event,simpy}" in out and "simpy_engine.py" in out
    bad = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--engine", "heap"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "invalid choice: 'heap'" in bad.stderr


def test_engines_by_name():
    assert set(ENGINES) == {"event", "simpy"}
    assert simulator("simpy").__module__ == "ppsim.sim.simpy_engine"
    with pytest.raises(ValueError, match="unknown engine 'heap'"):
        simulator("heap")
