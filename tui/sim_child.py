"""`python -m ppsim.tui.sim_child`: the TUI's simulation process (ppsim.tui.child.SimChild).

Reads length-prefixed pickled jobs from stdin and answers each on stdout
(ppsim.tui.child.serve) until stdin closes. Only the TUI's own process talks to it.
A module of its own so the pickled answers name `ppsim.tui.child`, not `__main__`.
"""

from __future__ import annotations

import sys

from ppsim.tui.child import serve


def main() -> int:
    serve(sys.stdin.buffer, sys.stdout.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
