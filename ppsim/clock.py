"""When this process started, so a time budget can cover the whole command.

A user's `--time-budget 5` means five seconds from pressing enter, not from
the moment the search begins: interpreter start and imports count too. Only for
the `ppsim` script: a host that calls `main()` itself (tests, the demo) had its own
business before the call, so its command starts at the call.
"""

from __future__ import annotations

import os
import time

STARTUP_S = 5.0
"""The longest interpreter start and imports we attribute to a command."""
_SCRIPT = False


def started_by_script() -> None:
    """Called by the `ppsim` script before it runs a command: count its start-up."""
    global _SCRIPT
    _SCRIPT = True


def process_start() -> float:
    """The process's start as a time.perf_counter() value under the `ppsim` script;
    now where unknown or when a host called the command."""
    now = time.perf_counter()
    if not _SCRIPT:
        return now
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    # A process older than a command's start-up is a host calling in (tests, the TUI):
    # its age is not this command's.
    return now - age if 0.0 <= age <= STARTUP_S else now
