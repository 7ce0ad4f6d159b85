"""How a rank's failure stops the others (the protocol ppsim.executor.worker's docstring
describes): the abort key in the job's store, each rank's watchdog thread polling it, the
one `ppsim-error:` line of the rank at fault and the `ppsim-abort:` lines of the rest."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from ppsim.executor import progress
from ppsim.executor.launch import STORE_ENV, printable
from ppsim.executor.runspec import RunSpec
from ppsim.executor.runtime import OpFailed

ABORT_KEY = "ppsim/abort"


def store_address() -> tuple[str, int]:
    """The job's store: the one `ppsim run` hosts, else torchrun's (MASTER_ADDR/PORT)."""
    if os.environ.get(STORE_ENV):
        host, port = os.environ[STORE_ENV].rsplit(":", 1)
        return host.strip("[]"), int(port)
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


class Watchdog:
    """Ends this process promptly when another rank has failed."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.published = ""
        self.stop = threading.Event()
        # A client of its own: the main thread may be blocked inside the store.
        host, port = store_address()
        self.store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self._publish()
                if not self.store.check([ABORT_KEY]):
                    continue
                why = self.store.get(ABORT_KEY).decode("utf-8", "replace")
            except Exception:  # the store is gone: the job ended without us
                if self.stop.is_set():
                    return
                why = "the job's rendezvous store went away"
            _report_once()
            _stopping(self.rank, why)

    def _publish(self) -> None:
        """This rank's progress record, for a rank that times out to read."""
        snap = progress.RANK.snapshot()
        if snap != self.published:
            self.store.set(progress.KEY.format(rank=self.rank), snap)
            self.published = snap

    def records(self) -> list[progress.Record]:
        """Every rank's last published progress (best effort: missing ones left out)."""
        out = []
        for r in range(self.world):
            key = progress.KEY.format(rank=r)
            try:
                raw = self.store.get(key) if self.store.check([key]) else None
            except Exception:
                raw = None
            rec = progress.parse(raw) if raw is not None else None
            if rec is not None:
                out.append(rec)
        return out

    def claim(self, message: str) -> str | None:
        """Publish this rank's failure; returns an earlier rank's, if one came first."""
        try:
            got = self.store.compare_set(ABORT_KEY, "", message).decode("utf-8", "replace")
        except Exception:
            return None  # best effort: torchrun and the timeout still end the others
        return None if got == message else got

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


REPORTED_EXIT_DELAY_S = 0.3
"""How long a rank that reported its failure waits before it exits. torchrun, forking
its ranks, records only the first failed rank it sees at a poll (every 0.1 s); a rank
that died without a word (SIGKILL, the OOM killer) is the cause and must be that one,
not the rank that then noticed a reset connection."""


_REPORTING = threading.Lock()
"""Held by the one thread of this process that reports and ends it: the main thread's
own failure, or the watchdog's news of another rank's (each rank prints one line)."""


def _report_once() -> None:
    """Return in the first thread to report; any later one waits for that one's exit."""
    if not _REPORTING.acquire(blocking=False):
        threading.Event().wait()


def _exit_reported(code: int) -> None:
    time.sleep(REPORTED_EXIT_DELAY_S)
    os._exit(code)


def _stopping(rank: int, why: str) -> None:
    # `why` came over the network: print it with control characters escaped.
    sys.stderr.write(f"ppsim-abort: rank {rank} stopping: {printable(why)}\n")
    sys.stderr.flush()
    _exit_reported(3)


def fail(spec: RunSpec, rank: int, dog: Watchdog, exc: BaseException) -> None:
    """Report this rank's failure, or stop quietly if it is a consequence of another's."""
    if spec.fault_mode == "kill" and isinstance(exc, OpFailed) and \
            "--inject-fault" in str(exc.__cause__):
        os.kill(os.getpid(), signal.SIGKILL)  # a silent death, as the OOM killer deals
    _report_once()
    msg = str(exc) if isinstance(exc, OpFailed) else \
        f"rank {rank} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, OpFailed) and progress.is_timeout(exc):
        # The rank that noticed is rarely the one at fault: blame the stalled one.
        culprit = progress.stalled(dog.records(), rank)
        if culprit is not None:
            msg = progress.blame(culprit, rank, msg)
    earlier = dog.claim(msg)
    if earlier is not None:
        _stopping(rank, earlier)
    sys.stderr.write(f"ppsim-error: {printable(msg)}\n")
    sys.stderr.flush()
    _exit_reported(1)  # no clean shutdown: peers may be blocked on us
