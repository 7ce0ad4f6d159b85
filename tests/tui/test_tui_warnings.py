"""The TUI's warning lines (ppsim.tui.cautions.state_warnings) are the lines `ppsim
simulate` and `ppsim split` print on stderr for the state shown, each once: checked
against the command line itself, run on the state's saved config."""

from __future__ import annotations

import tempfile
from pathlib import Path

from helpers import run_cli
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.config.schema import Config, load_config
from ppsim.config.to_toml import config_to_toml
from ppsim.errors import UserError
from ppsim.pipeline.problem import build_problem
from ppsim.tui.cautions import state_warnings
from ppsim.tui.editing import EditRefused
from ppsim.tui.session import EditState, apply_setting, config_for, state_from_config


def edited(*edits: tuple[str, str]) -> tuple[Config, EditState]:
    """The embedded default (tiny GPT, pp 2, 8 microbatches) after the settings edits."""
    base = load_config(None)
    state = state_from_config(base)
    for name, text in edits:
        state = apply_setting(base, state, name, text)
    return base, state


def warnings_of(base: Config, state: EditState) -> tuple[str, ...]:
    cfg = config_for(base, state)
    return state_warnings(cfg, build_problem(cfg))


def cli_lines(cfg: Config) -> list[str]:
    """What `simulate` then `split` print on stderr for `cfg`, without the command's name,
    each once."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.toml"
        path.write_text(config_to_toml(cfg))
        lines: list[str] = []
        for command in ("simulate", "split"):
            ran = run_cli([command, "--config", str(path)])
            assert ran.returncode == 0, ran.stderr
            for line in ran.stderr.splitlines():
                said = line.removeprefix(f"ppsim {command}: ")
                if said not in lines:
                    lines.append(said)
    return lines


def test_fewer_microbatches_than_ranks_interleaved_is_one_warning() -> None:
    base, state = edited(("vpp", "2"), ("microbatches", "1"))
    assert state.schedule == "interleaved-1f1b"
    (line,) = warnings_of(base, state)
    assert line.startswith("warning: Megatron refuses this interleaved order: a microbatch "
                           "group of 1 is outside [pp=2, m=1]")


def test_megatrons_default_group_is_named_with_the_flag_that_fixes_it() -> None:
    base, state = edited(("vpp", "2"), ("microbatches", "3"))
    (line,) = warnings_of(base, state)
    assert "default group size (pp = 2)" in line
    assert "--microbatch-group-size-per-virtual-pipeline-stage 3" in line


def test_the_edit_that_fixes_it_clears_it() -> None:
    for edits in ((("vpp", "2"), ("microbatches", "4")),
                  (("vpp", "2"), ("microbatches", "1"), ("vpp", "1")),
                  ()):
        assert warnings_of(*edited(*edits)) == ()


@settings(max_examples=25, deadline=None)
@given(pp=st.integers(1, 4), vpp=st.integers(1, 3), microbatches=st.integers(1, 9),
       schedule=st.sampled_from(["1f1b", "interleaved-1f1b", "interleaved-zb", "gpipe"]))
def test_the_lines_are_what_simulate_and_split_print(pp: int, vpp: int, microbatches: int,
                                                     schedule: str) -> None:
    try:
        base, state = edited(("schedule", schedule), ("pp", str(pp)), ("vpp", str(vpp)),
                             ("microbatches", str(microbatches)))
        cfg = config_for(base, state)
        problem = build_problem(cfg)
    except (EditRefused, UserError):
        assume(False)  # the TUI refuses the edit: nothing is shown for it
        raise
    assert list(state_warnings(cfg, problem)) == cli_lines(cfg)


def test_a_state_simulated_in_the_child_carries_its_warnings() -> None:
    """A large state runs in ppsim.tui.sim_child: its result says the same lines."""
    from ppsim.tui.child import SimChild, evaluate_views

    base, state = edited(("vpp", "2"), ("microbatches", "3"))
    here = evaluate_views(base, state, None).result.warnings
    child = SimChild()
    try:
        there = child.evaluate(base, state, None, None).result.warnings
    finally:
        child.close()
    assert there == here == warnings_of(base, state) and len(here) == 1
