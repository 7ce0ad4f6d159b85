"""Progress in a log: throttled lines, never a bar's redraws, never silent for long work."""

from __future__ import annotations

import io
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.loglines import LogLines


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


def test_plan_off_a_terminal_writes_plain_lines_not_a_bar() -> None:
    # A search long enough to pass the quiet time: its log holds lines, no escape codes.
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "plan", "--preset", "llama3-70b",
                        "--pp", "8", "--search", "vpp", "--time-budget", "6"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("ppsim plan: planning ")]
    assert progress and all(ln.endswith(" s)") for ln in progress), r.stderr
    assert "\x1b[" not in r.stderr and "\r" not in r.stderr
