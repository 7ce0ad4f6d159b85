"""How the command line's flags combine: values that name nothing, one setting given
under two names, and the flag an error names."""

from __future__ import annotations

import pytest
from helpers import run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a command refused with exit status 2."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("argv", [
    ["simulate", "--preset", ""], ["simulate", "--hardware="], ["plan", "--preset", " "],
    ["costs", "--costs", ""], ["simulate", "--actions-csv="], ["schedule", "--hardware", ""],
    ["simulate", "--compare-log", ""], ["tui", "--preset", ""],
    ["run", "--print-launch", "--model", ""], ["run", "--print-launch", "--versus", ""],
    ["profile", "--model", ""], ["profile", "--out", ""], ["profile", "--hardware-out", " "],
    ["calibrate", "--hardware-out", "", "--log", "train.log"],
    ["calibrate", "--out", "", "trace.json"]])
def test_an_empty_name_or_path_is_refused_not_read_as_no_flag(
        argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--preset ''` (a shell variable left unset) ran the embedded default, `--hardware ''`
    the preset on the default's CPU: the flag's name and what to give, on one line."""
    monkeypatch.chdir(tmp_path)  # what a command run in spite of it would write
    flag = next(a.split("=")[0] for a in argv if a.startswith("--") and a != "--print-launch")
    line = _refused(argv, capsys)
    assert flag in line and "is empty" in line


def _aliases(command: str) -> dict[str, list[str]]:
    """Each one-value setting of `command` that has several long names: dest -> names,
    read off the parser as a user reads --help."""
    from ppsim.cli.main import _subparser, build_parser

    p = _subparser(build_parser(command), command)
    names: dict[str, list[str]] = {}
    for action in p._actions:
        if action.nargs is None and action.option_strings:
            names.setdefault(action.dest, []).extend(
                o for o in action.option_strings if o.startswith("--"))
    return {d: n for d, n in names.items() if len(n) > 1}


ALIASED = {"pp": ("2", "4"), "tp": ("2", "4"), "vpp": ("2", "4"), "cp": ("1", "2"),
           "ep": ("1", "2"), "first_stage_layers": ("3", "5"),
           "offload_fraction": ("0.5", "1")}
"""Two values each of these settings takes."""


def test_the_sizes_megatron_and_ppsim_both_name_are_the_aliases_checked() -> None:
    assert set(ALIASED) <= set(_aliases("simulate"))
    assert {"--pp", "--pipeline-model-parallel-size"} <= set(_aliases("simulate")["pp"])


@settings(max_examples=40, derandomize=True, deadline=None)
@given(data=st.data())
def test_one_setting_under_two_names_with_two_values_is_refused(data: st.DataObject) -> None:
    """`--pp 4 --pipeline-model-parallel-size 2` planned pp 2 and `--tp 2
    --tensor-model-parallel-size 4` tp 4, whichever came last, silently; the same value
    under both names runs in either order, and one name twice keeps the last, as
    Megatron's parser does."""
    dest = data.draw(st.sampled_from(sorted(ALIASED)))
    first, second = data.draw(st.permutations(_aliases("simulate")[dest]))[:2]
    a, b = ALIASED[dest]
    eq = data.draw(st.booleans())
    base = ["simulate", "--preset", "tiny-llm", "--microbatches", "4", "--json"]
    if dest == "offload_fraction":  # Megatron reads the fraction under its switch only
        base += ["--fine-grained-activation-offloading", "--offload-modules", "core_attn"]
    second_words = [f"{second}={b}"] if eq else [second, b]
    code, _, err = run_main([*base, first, a, *second_words])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and first in lines[0] and second in lines[0], lines
    agree = run_main([*base, first, a, second, a])
    assert agree[0] == 0 and agree[:2] == run_main([*base, second, a, first, a])[:2]
    twice = run_main([*base, second, b, second, a])
    assert twice[:2] == run_main([*base, second, a])[:2]


@pytest.mark.parametrize("flag", ["--hidden-dropout", "--attention-dropout"])
@pytest.mark.parametrize("value", ["nan", "inf", "1", "-0.1"])
def test_a_dropout_out_of_range_is_refused_in_its_own_name(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--attention-dropout inf` was refused as "--hidden-dropout: ... got [inf]", sending
    the user to a flag they gave right (or did not give)."""
    other = ({"--hidden-dropout", "--attention-dropout"} - {flag}).pop()
    line = _refused(["simulate", "--preset", "tiny-llm", other, "0.1", flag, value], capsys)
    assert line.split(": error: ")[1].startswith(f"{flag}:") and other not in line


@pytest.mark.parametrize("pair", [("--use-torch-fsdp2", "--use-megatron-fsdp"),
                                  ("--fsdp-reshard-after-forward=always",
                                   "--torch-fsdp2-no-reshard-after-forward")])
@pytest.mark.parametrize("backwards", [False, True])
def test_two_switches_that_set_one_field_two_ways_are_refused(
        pair: tuple[str, str], backwards: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """`--use-torch-fsdp2 --use-megatron-fsdp` priced Megatron-FSDP and the other order
    torch's FSDP2 (whichever came last): the two implementations, or the two reshard
    policies, are refused in either order, naming both."""
    first, second = pair[::-1] if backwards else pair
    line = _refused(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--dp",
                     "8", "--pp", "1", "--bf16", "--no-gradient-accumulation-fusion", "--fsdp",
                     first, second], capsys)
    assert all(flag.split("=")[0] in line for flag in pair)


@pytest.mark.parametrize("flag", ["--hybrid-layer-pattern", "--hybrid-override-pattern"])
def test_an_empty_hybrid_pattern_is_refused_not_read_as_a_gpt_stack(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--hybrid-layer-pattern ''` over a hybrid preset priced a GPT stack of its layer
    count; Megatron reads an empty pattern as no override (its ratios: Mamba layers)."""
    line = _refused(["simulate", "--preset", "tiny-hybrid", flag, ""], capsys)
    assert flag in line and "is empty" in line
