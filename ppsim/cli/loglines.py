"""Progress for a log rather than a terminal (CI, `| tee`, a batch job's output file).

A bar redraws one line in place, which a log cannot show; off a terminal the long
commands write plain lines to stderr instead, throttled so a log stays short: nothing
for work done within `quiet_s`, then a line when the step changes and one every
`every_s` while a step runs on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class LogLines:
    """Throttled progress lines: `lines(step, detail)` before or during each step."""

    def __init__(self, command: str, *, quiet_s: float = 2.0, every_s: float = 10.0,
                 stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._command = command
        self._quiet_s = quiet_s
        self._every_s = every_s
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._last_step: str | None = None
        self._last_line_at = float("-inf")

    def __call__(self, step: str, detail: str = "") -> None:
        now = self._clock()
        elapsed = now - self._start
        if elapsed < self._quiet_s:
            return
        if step == self._last_step and now - self._last_line_at < self._every_s:
            return
        self._last_step, self._last_line_at = step, now
        text = f"{step}, {detail}" if detail else step
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            stream.write(f"{self._command}: {text} ({elapsed:.0f} s)\n")
            stream.flush()
        except (OSError, ValueError):  # a closed or full log must not stop the work
            pass

    def steps(self, what: str, done: int, total: int) -> None:
        """The (what, done, total) form the search commands report in."""
        self(what, f"{done} of {total}")


def for_log(command: str, *, quiet_s: float = 2.0) -> LogLines | None:
    """Progress lines for `command` where stderr is a log, not a terminal; None on a
    terminal, where the command draws its bar instead."""
    try:
        terminal = sys.stderr.isatty()
    except (OSError, ValueError):  # a closed stderr: nothing to show either way
        terminal = True
    return None if terminal else LogLines(command, quiet_s=quiet_s)
