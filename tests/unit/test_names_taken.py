"""Names a user may write otherwise than ppsim does. Schedules named as torch names them
(torchtitan's `pipeline_parallel_schedule`, torch's get_schedule_class: "Interleaved1F1B",
"ZBVZeroBubble", in any case) are taken on the command line, in a config and in the TUI;
ppsim's own names in any case too. An unknown preset or schedule points to close names."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from ppsim.config.presets import HARDWARE_PRESETS, MODEL_PRESETS
from ppsim.config.schema import config_from_dict, load_config
from ppsim.errors import one_of
from ppsim.schedules.generators import SCHEDULES, schedule_name
from ppsim.tui.session import apply_setting, state_from_config

# torch.distributed.pipelining.schedules.get_schedule_class's names (torch 2.5+), written
# out here, against the ppsim schedule that runs the same order.
TORCH = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved-1f1b",
         "InterleavedZeroBubble": "interleaved-zb", "ZBVZeroBubble": "zbv",
         "DualPipeV": "dualpipev"}


def cased(text: str) -> st.SearchStrategy[str]:
    """`text` with each letter in either case."""
    return st.lists(st.booleans(), min_size=len(text), max_size=len(text)).map(
        lambda flips: "".join(c.upper() if f else c.lower()
                              for c, f in zip(text, flips, strict=True)))


@given(st.data())
def test_torch_and_ppsim_names_in_any_case_give_ppsim_s(data: st.DataObject) -> None:
    torch_name = data.draw(st.sampled_from(sorted(TORCH)))
    prefix = data.draw(st.sampled_from(["", "Schedule"]))
    assert schedule_name(data.draw(cased(prefix + torch_name))) == TORCH[torch_name]
    own = data.draw(st.sampled_from(sorted(SCHEDULES)))
    assert schedule_name(data.draw(cased(own))) == own


def test_an_unknown_name_is_kept_for_its_check_to_name() -> None:
    assert schedule_name("LoopedBFS") == "LoopedBFS"


def test_a_config_takes_torchtitan_s_name() -> None:
    cfg = config_from_dict({"model": {"preset": "tiny-gpt"},
                            "pipeline": {"schedule": "Interleaved1F1B", "vpp": 2}})
    assert cfg.pipeline.schedule == "interleaved-1f1b"


def test_the_command_line_takes_torch_s_name() -> None:
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--preset", "tiny-gpt",
                        "--schedule", "ZBVZeroBubble", "--json"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert '"schedule": "zbv"' in r.stdout


def test_the_tui_setting_takes_torch_s_name() -> None:
    base = load_config(None)
    state = apply_setting(base, state_from_config(base), "schedule", "GPipe")
    assert state.schedule == "gpipe"


NAMES = st.text(alphabet="abcdeAB0123-.", min_size=1, max_size=12)


@given(NAMES, st.lists(NAMES, min_size=1, max_size=8, unique=True))
def test_a_suggestion_is_always_a_real_choice(value: str, choices: list[str]) -> None:
    fix = one_of(value, choices)
    assert fix.endswith("choose one of " + ", ".join(choices))
    if fix.startswith("did you mean "):
        said = fix.removeprefix("did you mean ").split("? choose one of ")[0]
        assert all(name in choices for name in said.split(" or "))


def test_a_preset_named_in_part_or_in_capitals_is_pointed_to() -> None:
    assert one_of("h100", HARDWARE_PRESETS).startswith("did you mean h100-80gb? ")
    assert one_of("H100-80GB", HARDWARE_PRESETS).startswith("did you mean h100-80gb? ")
    assert one_of("llama3", MODEL_PRESETS).startswith(
        "did you mean llama3-8b or llama3-70b or llama3.1-405b? ")
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "plan", "--hardware", "h100"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "did you mean h100-80gb?" in r.stderr
