"""Where a run's results go: a fresh directory per run, never deleting earlier results.

Without `--trace-dir` a run gets `ppsim-run/<time>` of its own, and after it
succeeds `ppsim-run/latest` points at it. An explicit `--trace-dir` that
already holds a run's results is refused, not cleared. Either way the
directory is checked writable (and roomy enough) before any rank starts, and
a lock file per node keeps two runs from writing one directory at once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from ppsim.errors import UserError
from ppsim.fileio import process_alive, shown

DEFAULT_ROOT = "ppsim-run"
RESULTS = ("trace.json", "summary.json", "parts", "versus", "torch")
SPEC = "run-spec.json"
"""The run spec the ranks read (ppsim.executor.runspec); not a result: a failed run's
is removed with its other files."""
BYTES_PER_OP = 2048
"""Trace bytes per op and iteration, parts and merged trace together (generous)."""


def run_name() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def planned(trace_dir: str | None) -> str:
    """The directory a printed launch command should name (created when it runs)."""
    return trace_dir if trace_dir is not None else os.path.join(DEFAULT_ROOT, run_name())


def spec_path(folder: str) -> str:
    """Where a run's spec goes: inside its folder, beside the results it leads to."""
    return os.path.join(folder, SPEC)


@dataclass
class RunDir:
    path: str
    created: bool
    """This run made the directory (so it may remove it again if the run leaves it empty)."""
    fresh: bool
    """A default per-run directory: `latest` points at it once the run succeeds."""
    lock: str


def _problem(path: str, what: str, exc: OSError, field: str = "--trace-dir") -> UserError:
    return UserError(field, f"{shown(path)}: cannot {what}: {exc.strerror}",
                     "choose a writable directory")


def fresh(root: str, field: str = "--trace-dir") -> str:
    """A new folder `<root>/<time>` (with a suffix when taken); `field` names the flag."""
    if os.path.lexists(root) and not os.path.isdir(root):
        raise UserError(field, f"{shown(root)} exists and is not a directory (a fresh folder "
                        "goes inside it)", f"move that file away, or give "
                        f"{field} a directory")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise _problem(root, "create it", exc, field) from None
    stamp = run_name()
    for n in range(1000):
        path = os.path.join(root, stamp if n == 0 else f"{stamp}-{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise _problem(path, "create it", exc, field) from None
    raise UserError(field, f"no free run directory name under {shown(root)}",
                    f"pass another {field}")


def _take_lock(path: str, node_rank: int) -> str:
    lock = os.path.join(path, f".ppsim-lock-node{node_rank}")
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                with open(lock, encoding="ascii") as fh:
                    pid = int(fh.read().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and process_alive(pid):
                raise UserError("--trace-dir", f"another ppsim run (pid {pid}) is writing "
                                f"into {shown(path)}", "use another directory") from None
            os.unlink(lock)  # left by a run that no longer exists
            continue
        except OSError as exc:
            raise _problem(path, "write into it", exc) from None
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(f"{os.getpid()}\n")
        return lock
    raise UserError("--trace-dir", f"cannot lock {shown(path)}", "use another directory")


def _check_room(path: str, need: int) -> None:
    try:
        fd, probe = tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-probe-", dir=path)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
        free = shutil.disk_usage(path).free
    except OSError as exc:
        raise _problem(path, "write into it", exc) from None
    if free < need:
        raise UserError("--trace-dir", f"{shown(path)} has {free / 1e6:.1f} MB free but the "
                        f"trace needs about {need / 1e6:.1f} MB",
                        "free some space, choose another directory, or run fewer iterations")


def prepare(trace_dir: str | None, node_rank: int, need_bytes: int) -> RunDir:
    """Make (or check) the run's directory before any rank starts; UserError if unusable."""
    if trace_dir is None:
        path, created, is_fresh = fresh(DEFAULT_ROOT), True, True
    else:
        path, is_fresh = trace_dir, False
        if os.path.lexists(path) and not os.path.isdir(path):
            raise UserError("--trace-dir", f"{shown(path)} exists and is not a directory",
                            "give a directory path")
        created = not os.path.exists(path)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise _problem(path, "create it", exc) from None
    lock = _take_lock(path, node_rank)
    try:
        old = [name for name in RESULTS if os.path.lexists(os.path.join(path, name))]
        if old:
            raise UserError("--trace-dir", f"{shown(path)} holds an earlier run's results "
                            f"({', '.join(old)}); ppsim never overwrites them",
                            "pass a new directory, or leave --trace-dir out for a fresh "
                            f"{DEFAULT_ROOT}/<time>")
        _check_room(path, need_bytes)
    except UserError:
        release(RunDir(path, created, is_fresh, lock), [])
        raise
    return RunDir(path, created, is_fresh, lock)


def release(run: RunDir, discard: list[str]) -> None:
    """End the run's hold on its directory; `discard`: this run's files to remove (failure)."""
    for f in discard:
        if os.path.lexists(f):
            os.unlink(f)
    for folder in ("parts", os.path.join("versus", "parts"), "versus",
                   os.path.join("torch", "parts"), "torch"):
        folder = os.path.join(run.path, folder)
        if discard and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
    if os.path.lexists(run.lock):
        os.unlink(run.lock)
    if run.created and os.path.isdir(run.path) and not os.listdir(run.path):
        os.rmdir(run.path)


def link_latest(run: RunDir) -> None:
    """Point `<root>/latest` at this run (relative link, swapped atomically)."""
    if not run.fresh:
        return
    root, name = os.path.split(run.path)
    latest = os.path.join(root, "latest")
    if os.path.lexists(latest) and not os.path.islink(latest):
        return  # something of the user's: leave it alone
    tmp = os.path.join(root, f".tmp-{os.getpid()}-latest")
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(name, tmp)
        os.replace(tmp, latest)
    except OSError:
        if os.path.lexists(tmp):
            os.unlink(tmp)
