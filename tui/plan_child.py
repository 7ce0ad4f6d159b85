"""`python -m ppsim.tui.plan_child`: the TUI's planner process.

Reads one pickled (base Config, EditState) from stdin and writes pickled
messages to stdout: ("progress", done, total) ..., then ("done", PlanResult)
or ("error", text). Only the TUI's own parent process talks to it.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from ppsim.tui.session import plan_in_child


class _Pipe:
    """What ppsim.tui.session.plan_in_child sends to: one flushed pickle per message."""

    def __init__(self, out: Any) -> None:
        self.out = out

    def send(self, msg: tuple) -> None:
        pickle.dump(msg, self.out)
        self.out.flush()


def main() -> int:
    base, state = pickle.load(sys.stdin.buffer)
    plan_in_child(base, state, _Pipe(sys.stdout.buffer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
