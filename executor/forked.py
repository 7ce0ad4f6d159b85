"""torchrun run in a forked child of `ppsim run`, which has imported torch already.

`python -m torch.distributed.run` would import torch again before it starts a
rank (1.7 s of CPU here), and a rank that recomputes or runs torch's pipelining
imports torch._dynamo (1.6 s more) once per rank. Forking torchrun from this
process, with those modules imported once beforehand, leaves a small run's
start-up to the rendezvous. The child is torchrun's own `main()`, in a new
session as `subprocess.Popen(start_new_session=True)` would start it, its
stdout and stderr one pipe this process reads; `ForkedProcess` offers the part
of Popen's interface `run_torchrun` uses (the e2e tests fork `ppsim` itself so).
torchrun's process uses no CUDA; with `--device cuda` its ranks are exec'd
(launch.rank_start), since ppsim run has touched the driver by then.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import TextIO


def preload(modules: Iterable[str]) -> None:
    """Import `modules` here, so that torchrun and the ranks it forks inherit them."""
    import importlib

    for name in modules:
        importlib.import_module(name)


class ForkedProcess:
    """A forked child running `target()` (its return: the exit status) in a new session,
    its stdout and stderr pipes to this process; Popen's pid, stdout, stderr, poll, wait."""

    def __init__(self, target: Callable[[], int], env: dict[str, str], *,
                 close_fds: Iterable[int] = (), cwd: str | None = None,
                 stderr_apart: bool = False) -> None:
        self_pid = os.getpid()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe() if stderr_apart else (out_r, out_w)
        # The child (and the ranks torchrun forks from it) inherit every object of this
        # process frozen: a rank's collection before its timed loop (executor/quiet.py)
        # then walks only its own objects, not the parent's millions (torch, and a test
        # session's), which it would also copy page by page on write. A parent that froze
        # objects itself (the TUI does) keeps them frozen: unfreezing is all or nothing.
        held = gc.get_freeze_count()
        gc.freeze()
        try:
            pid = os.fork()
        finally:
            if os.getpid() == self_pid and not held:
                gc.unfreeze()
        if pid == 0:  # the child: never returns
            for fd in {out_r, err_r}:
                os.close(fd)
            _child(target, env, (out_w, err_w), list(close_fds), cwd)
        for fd in {out_w, err_w}:
            os.close(fd)
        self.pid = pid
        self.returncode: int | None = None
        self.stdout: TextIO = open(out_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr: TextIO | None = (open(err_r, encoding="utf-8", errors="replace")  # noqa: SIM115
                                      if stderr_apart else None)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired("forked", timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


def torchrun(argv: list[str]) -> Callable[[], int]:
    """torchrun's main(argv), as a ForkedProcess target."""

    def run() -> int:
        if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
            sys.path.pop(0)  # as `python -P`: the working directory is not importable
        from torch.distributed.run import main

        _cheap_rendezvous_names()

        sys.argv = ["torchrun", *argv]
        main(argv)
        return 0

    return run


def _cheap_rendezvous_names() -> None:
    """torch's dynamic rendezvous names each event it records after the function that
    recorded it, found by `inspect.stack()`, which reads the source of every frame on
    the stack: ~10 % of a small launch's CPU here. One frame lookup finds the same name."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:  # pragma: no cover - torch without elastic
        return
    if not callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        return

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # a stack shallower than depth, as torch's answers
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name


def _child(target: Callable[[], int], env: dict[str, str], fds: tuple[int, int],
           close_fds: list[int], cwd: str | None) -> None:
    code = 1
    try:
        os.setsid()
        for fd in close_fds:  # e.g. the job store's listening socket: not the child's
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)  # nothing the parent reads from is ours
        os.dup2(null, 0)
        os.close(null)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in set(fds):
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handlers are not ours
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Fresh stream objects: a lock another thread of the parent held stays held here.
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        code = target()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the report, then the exit status
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
