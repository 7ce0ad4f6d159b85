"""Each rank's own progress record, and who to blame when a transfer times out.

A rank that times out waiting for a message is rarely the one at fault: the
rank that should have sent it is stuck (a hung op, a sleeping builder), and
the waiting one merely noticed first. So every rank keeps a record of its last
finished op and whether it is blocked in a receive; the watchdog thread
publishes it to the job's store, and a rank that times out reads them all and
blames the rank that is not waiting and finished its last op earliest.
One process is one rank, so the record is this module's `RANK`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

KEY = "ppsim/progress/{rank}"


@dataclass(kw_only=True)
class Record:
    """What one rank last did (plain values: it crosses the store as JSON)."""

    rank: int = -1
    """The global rank (set when the worker starts)."""
    done: int = 0
    """Ops finished so far, every iteration counted."""
    last: str = ""
    """The last finished op, e.g. "F3 (stage 1) of iteration 2"; empty: none yet."""
    last_at: float = 0.0
    """Wall-clock time (time.time()) it finished; 0: none yet."""
    current: str = ""
    """The op running now; empty between ops."""
    waiting: bool = False
    """Blocked in a receive, waiting for another rank's message."""


class Progress:
    """This process's record, written by the training thread, read by the watchdog."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.record = Record()

    def start(self, op: str) -> None:
        with self._lock:
            self.record.current = op

    def finish(self, op: str) -> None:
        with self._lock:
            self.record.done += 1
            self.record.last, self.record.last_at = op, time.time()
            self.record.current, self.record.waiting = "", False

    def wait(self, waiting: bool) -> None:
        with self._lock:
            self.record.waiting = waiting

    def snapshot(self) -> str:
        with self._lock:
            return json.dumps(asdict(self.record))


RANK = Progress()


def parse(raw: bytes) -> Record | None:
    """A published record; None if it cannot be read (it is a hint, never fatal)."""
    try:
        data: Any = json.loads(raw.decode("utf-8", "replace"))
        return Record(**{k: data[k] for k in Record.__dataclass_fields__ if k in data})
    except (ValueError, TypeError, AttributeError):
        return None


def stalled(records: list[Record], me: int) -> Record | None:
    """The rank to blame for `me`'s timeout: of the ranks not blocked in a receive, the
    one whose last op finished earliest (one that finished none, first); None when
    that is `me` or no other rank is known."""
    busy = [r for r in records if not r.waiting] or records
    if not busy:
        return None
    worst = min(busy, key=lambda r: (r.last_at, r.done, r.rank))
    return None if worst.rank == me else worst


def is_timeout(exc: BaseException) -> bool:
    """A transfer that gave up waiting (gloo: "Timed out waiting ... for recv")."""
    text = f"{exc} {exc.__cause__ or ''}".lower()
    return "timed out" in text or "timeout" in text


def blame(record: Record, me: int, what: str, now: float | None = None) -> str:
    """The failure line naming the stalled rank, and the rank that noticed."""
    now = time.time() if now is None else now
    since = f"for {now - record.last_at:.1f} s" if record.last_at else "since the start"
    doing = f", still in {record.current}" if record.current else ""
    last = f" (its last finished op: {record.last})" if record.last else ""
    return (f"rank {record.rank} failed: it made no progress {since}{doing}{last}; rank "
            f"{me} timed out waiting for it: {what}")
