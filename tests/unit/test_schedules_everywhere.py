"""The new schedules and a torch CSV reach every consumer through the action lists.

The TUI's schedule setting offers interleaved-zb and its numbers are simulate's; a
config naming an actions CSV drives the TUI's evaluation with that order.
"""

from __future__ import annotations

import json

import pytest
from helpers import run_main

from ppsim.config.schema import load_config
from ppsim.pipeline.problem import build_problem
from ppsim.schedules.generators import SCHEDULES, build_schedule, schedule_placement
from ppsim.schedules.torchcsv import to_torch_csv
from ppsim.sim.simulate import simulate
from ppsim.tui.session import apply_setting, evaluate_state, state_from_config
from ppsim.tui.settings import SELECTS


def test_tui_offers_every_schedule_and_simulates_interleaved_zb():
    (choices,) = [c for name, _, c in SELECTS if name == "schedule"]
    assert tuple(choices) == tuple(SCHEDULES) and "interleaved-zb" in choices
    base = load_config(None)
    state = apply_setting(base, state_from_config(base), "vpp", "2")
    state = apply_setting(base, state, "schedule", "interleaved-zb")
    state = apply_setting(base, state, "microbatches", "5")  # not a multiple of pp
    res = evaluate_state(base, state)
    assert res.sim.summary == simulate(build_problem(res.config)).summary
    assert res.config.pipeline.schedule == "interleaved-zb"


def test_tui_evaluates_the_order_of_an_actions_csv(tmp_path):
    path = tmp_path / "dualpipev.csv"
    path.write_text(to_torch_csv(build_schedule("dualpipev", 2, 2, 8)))
    base = load_config(None)
    base.pipeline.vpp, base.pipeline.schedule, base.pipeline.split = 2, "dualpipev", [2, 2, 1, 3]
    named = simulate(build_problem(base)).summary
    base.pipeline.actions_csv = str(path)
    res = evaluate_state(base, state_from_config(base))
    assert build_problem(res.config).schedule.name == "csv"
    assert res.sim.summary == named


@pytest.mark.parametrize("name", [n for n in SCHEDULES if schedule_placement(n) == "v"])
def test_a_v_schedule_named_alone_runs_its_two_chunks_a_rank(name: str) -> None:
    """`--schedule zbv` (or dualpipev) without --vpp was refused ("placement 'v' needs
    exactly 2 virtual stages per rank"), though a V schedule has no other choice and
    torchtitan builds its two stages a rank by itself. Named alone it now runs two; an
    explicit --vpp is still checked."""
    for command in ("simulate", "schedule"):
        code, out, err = run_main([command, "--schedule", name, "--microbatches", "8",
                                   "--json"])
        assert code == 0, err
        doc = json.loads(out)
        assert (doc["schedule"], doc["vpp"]) == (name, 2)
    code, _, err = run_main(["simulate", "--schedule", name, "--vpp", "1"])
    assert code == 2 and "pipeline.vpp" in err
    # The same with the vpp given: one answer.
    _, given, _ = run_main(["simulate", "--schedule", name, "--vpp", "2", "--microbatches",
                            "8", "--json"])
    _, alone, _ = run_main(["simulate", "--schedule", name, "--microbatches", "8", "--json"])
    assert json.loads(given)["iteration_time_ms"] == json.loads(alone)["iteration_time_ms"]


def test_a_config_naming_a_v_schedule_runs_its_two_chunks_a_rank(tmp_path) -> None:
    """A config's `schedule = "zbv"` without `vpp` was refused as --schedule zbv was; a
    vpp the file gives is still checked."""
    path = tmp_path / "v.toml"
    path.write_text('[model]\npreset = "tiny-llm"\n[pipeline]\npp = 2\nmicrobatches = 8\n'
                    'schedule = "dualpipev"\n')
    assert load_config(str(path)).pipeline.vpp == 2
    code, out, err = run_main(["simulate", "--config", str(path), "--json"])
    assert code == 0 and json.loads(out)["vpp"] == 2, err
    path.write_text(path.read_text() + "vpp = 1\n")
    code, _, err = run_main(["simulate", "--config", str(path)])
    assert code == 2 and "pipeline.vpp" in err


JOB = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16",
       "--global-batch-size", "64", "--time-budget", "8", "--json"]


@pytest.mark.parametrize("name, vpp", [("zbv", {2}), ("dualpipev", {2}), ("zb-h1", {1})])
def test_the_job_search_runs_the_schedule_it_is_given(name: str, vpp: set[int]) -> None:
    """`plan --gpus N --schedule zbv` planned Megatron's interleaved 1F1B (vpp 4) and said
    nothing: the job search set every shape's schedule from its vpp alone. Each shape now
    runs the schedule given, at the chunks it takes."""
    code, out, err = run_main([*JOB, "--schedule", name])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["held"] == {}  # the schedule's chunks are not a size the user gave
    for c in doc["candidates"]:
        assert c["schedule"] == name and c["vpp"] in vpp
        if name == "dualpipev":
            assert c["microbatches"] >= 2 * c["pp"]


def test_a_schedule_no_shape_runs_is_refused_in_its_own_words() -> None:
    code, _, err = run_main([*JOB, "--schedule", "zb-h1", "--vpp", "2"])
    assert code == 2 and "zb-h1 runs one chunk per rank but vpp = 2" in err
