"""`python -m ppsim.tui.plan_child`: the TUI's planner process.

Reads one pickled job from stdin: ("split", base Config, EditState) for the split
planner, ("policy", base Config, EditState, budget seconds) for the memory-policy
search. Writes pickled messages to stdout: ("progress", done, total) ... (the split
planner only), then ("done", PlanResult or SpaceBest) or ("error", text). Only the TUI's
own parent process talks to it.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from ppsim.tui.policy_plan import policy_in_child
from ppsim.tui.session import plan_in_child


class _Pipe:
    """What the planners' child entry points send to: one flushed pickle per message."""

    def __init__(self, out: Any) -> None:
        self.out = out

    def send(self, msg: tuple) -> None:
        pickle.dump(msg, self.out)
        self.out.flush()


def main() -> int:
    kind, base, state, *rest = pickle.load(sys.stdin.buffer)
    pipe = _Pipe(sys.stdout.buffer)
    if kind == "policy":
        policy_in_child(base, state, rest[0], pipe)
    else:
        plan_in_child(base, state, pipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
