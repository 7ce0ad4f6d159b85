"""Progress in a log: throttled lines, never a bar's redraws, never silent for long work."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli import plan
from ppsim.cli.flags import config_from_args
from ppsim.cli.loglines import LogLines, for_log
from ppsim.cli.main import build_parser


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(quiet_s: float = 2.0, every_s: float = 10.0) -> tuple[LogLines, FakeClock, io.StringIO]:
    clock, out = FakeClock(), io.StringIO()
    return LogLines("ppsim plan", quiet_s=quiet_s, every_s=every_s, stream=out,
                    clock=clock), clock, out


def test_work_within_the_quiet_time_prints_nothing() -> None:
    lines, clock, out = _lines()
    lines("planning pp=4", "3 splits timed")
    clock.now += 1.9
    lines("planning pp=8", "9 splits timed")
    assert out.getvalue() == ""


def test_a_new_step_gets_a_line_and_a_long_step_one_every_period() -> None:
    lines, clock, out = _lines()
    clock.now += 3
    lines("planning pp=4", "3 splits timed")
    clock.now += 1
    lines("planning pp=4", "7 splits timed")  # same step, 1 s later: held back
    clock.now += 1
    lines("planning pp=8", "1 splits timed")  # a new step: shown at once
    clock.now += 10
    lines("planning pp=8", "40 splits timed")  # 10 s on: shown again
    assert out.getvalue().splitlines() == [
        "ppsim plan: planning pp=4, 3 splits timed (3 s)",
        "ppsim plan: planning pp=8, 1 splits timed (5 s)",
        "ppsim plan: planning pp=8, 40 splits timed (15 s)",
    ]


def test_steps_reads_the_search_commands_form() -> None:
    lines, clock, out = _lines(quiet_s=0)
    lines.steps("pricing shapes", 12, 40)
    assert out.getvalue() == "ppsim plan: pricing shapes, 12 of 40 (0 s)\n"


def test_a_closed_log_does_not_stop_the_work() -> None:
    out = io.StringIO()
    out.close()
    LogLines("ppsim run", quiet_s=0, stream=out)("3 iterations", "iteration 1/3")


@given(st.lists(st.tuples(st.floats(0, 30), st.sampled_from("abc")), max_size=40))
def test_lines_are_never_closer_than_the_period_within_one_step(
        calls: list[tuple[float, str]]) -> None:
    lines, clock, out = _lines(quiet_s=2.0, every_s=10.0)
    shown: list[tuple[float, str]] = []
    for gap, step in calls:
        clock.now += gap
        before = out.getvalue()
        lines(step)
        if out.getvalue() != before:
            shown.append((clock.now, step))
    start = 100.0
    assert all(t - start >= 2.0 for t, _ in shown)
    for (t0, s0), (t1, s1) in zip(shown, shown[1:], strict=False):
        assert s0 != s1 or t1 - t0 >= 10.0
    # A step that runs past the quiet time is always shown once it reports.
    if calls and sum(g for g, _ in calls) >= 2.0:
        assert shown


class _Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize("terminal", [True, False])
def test_lines_are_for_a_log_and_a_bar_for_a_terminal(terminal, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stderr", _Stream(terminal))
    assert (for_log("ppsim plan") is None) is terminal


def test_plan_reports_each_variant_s_splits_in_a_log(monkeypatch) -> None:
    # The lines as a log receives them, from the first tick (no quiet time).
    out = io.StringIO()
    monkeypatch.setattr(plan, "for_log", lambda command, **_: LogLines(
        command, quiet_s=0, every_s=0, stream=out))
    cfg = config_from_args(build_parser("plan").parse_args(["plan", "--pp", "2"]))
    plan.run_search(cfg, ["vpp"], top_k=1, budget_s=5, silent=False)
    said = out.getvalue().splitlines()
    assert said and all(ln.startswith("ppsim plan: planning ") and " splits timed (" in ln
                        for ln in said), said
    assert {ln.split(",")[0] for ln in said} >= {"ppsim plan: planning as configured"}


def test_profile_off_a_terminal_writes_plain_lines_not_a_bar(tmp_path) -> None:
    # profile's lines start at once (its first step can take minutes on a large model).
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "profile", "--preset", "tiny-gpt",
                        "--repeats", "1", "--warmup", "0", "--no-p2p", "--out",
                        str(tmp_path / "c.json")],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("ppsim profile: ")]
    assert progress[0].startswith("ppsim profile: building pieces"), r.stderr
    assert all(ln.endswith(" s)") for ln in progress), r.stderr
    assert "\x1b[" not in r.stderr and "\r" not in r.stderr
