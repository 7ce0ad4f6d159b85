"""Atomic file writes: a crash never leaves half a file behind.

One writer for every output. It writes only regular files: a directory, a
device node, a FIFO or a socket at the target is refused (replacing
`/dev/null` as root would break the system), and so is a symlink unless the
caller passes `force` (then the link is followed and its target written).
The temp file sits beside the target and carries our pid, so a later write
to the same target can remove temp files left by an interrupted one.
The writer makes missing folders (ppsim's own layouts, such as a run's parts/);
a path the user names is checked first by `refuse_unwritable`, which refuses
one whose folder is missing or takes no new file.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ppsim.errors import UserError

STALE_AFTER_S = 3600.0
"""A temp file whose writer may still be alive is removed only after this long."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def shown(path: str) -> str:
    """The path as it is safe to print: control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)


def _refuse(path: str, problem: str, fix: str) -> UserError:
    return UserError(shown(path), problem, fix)


FOLLOW_LINKS = False
"""Set by the command line's --force: outputs that are symbolic links are written
through (their target replaced) instead of refused."""


def _target(path: str, force: bool) -> str:
    """The regular file (existing or not) that a write to `path` replaces."""
    force = force or FOLLOW_LINKS
    if path == "" or path.endswith(os.sep):
        raise _refuse(path, "is a directory, not a file name", "give a file name")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise _refuse(path, f"cannot write: {exc.strerror}", "choose another path") from None
    if stat.S_ISLNK(st.st_mode):
        if not force:
            raise _refuse(path, "is a symbolic link; ppsim does not replace links",
                          "remove the link, choose another path, or pass --force to write "
                          "the file it points to")
        return _target(os.path.realpath(path), force=False)
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is a directory", "give a file name inside it")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "is a special file (device, FIFO or socket); ppsim writes only "
                      "regular files", "choose a regular file path")
    return path


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def _suffix(name: str) -> str:
    """The temp file's tail: the target's name, cut so the temp name stays legal."""
    return "-" + name[-200:]


def clean_stale_temps(folder: str, name: str) -> list[str]:
    """Remove temp files of ours for `name` left by an interrupted write; returns them."""
    pattern = re.compile(r"\.tmp-(\d+)-[A-Za-z0-9_]+" + re.escape(_suffix(name)))
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        m = pattern.fullmatch(entry)
        if not m:
            continue
        full = os.path.join(folder, entry)
        try:
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            pid = int(m.group(1))
            if (pid != os.getpid() and process_alive(pid)) and now - st.st_mtime < STALE_AFTER_S:
                continue  # a write in progress elsewhere
            os.unlink(full)
            removed.append(full)
        except OSError:
            continue
    return removed


def write_text_atomic(path: str, text: str, *, force: bool = False,
                      field: str | None = None) -> None:
    write_bytes_atomic(path, text.encode("utf-8"), force=force, field=field)


def write_bytes_atomic(path: str, data: bytes, *, force: bool = False,
                       field: str | None = None) -> None:
    """Write to a temp file in the same folder, fsync, then rename over path.

    Every refusal or OS failure is a UserError (exit status 2) naming `field`
    (the flag or config key that gave the path) when given, else the path.
    """
    try:
        _write(path, data, force)
    except UserError as exc:
        if field is None:
            raise
        raise UserError(field, f"{exc.field} {exc.problem}", exc.fix) from None


def _temp_beside(path: str, folder: str, name: str) -> tuple[int, str]:
    """A new temp file in `folder` for the target `name`: (fd, its path)."""
    try:
        return tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-", suffix=_suffix(name),
                                dir=folder)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _refuse(path, "the file name is too long", "choose a shorter name") from None
        raise _refuse(path, f"cannot write: {exc.strerror}",
                      "choose a path in a writable folder") from None


def _write(path: str, data: bytes, force: bool) -> None:
    target = _target(path, force)
    folder, name = os.path.split(os.path.abspath(target))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise _refuse(path, f"cannot create its folder: {exc.strerror}",
                      "choose a path in a writable folder") from None
    clean_stale_temps(folder, name)
    fd, tmp = _temp_beside(path, folder, name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes 0600 files; give the result the usual permissions.
        os.chmod(tmp, 0o666 & ~_umask())
        _target(target, force=False)  # still a regular file (or absent) just before the rename
        os.replace(tmp, target)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _refuse(path, f"cannot write: {exc.strerror}",
                          "free some space or choose another path") from None
        raise


def write_json_atomic(path: str, obj: Any, *, force: bool = False,
                      field: str | None = None) -> None:
    write_text_atomic(path, json.dumps(obj, separators=(",", ":")) + "\n", force=force,
                      field=field)


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: the same resolved path, or (both existing) the
    same inode, so a hard link or `./x` against `x` is caught too."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Overlap:
    """An output path that is an input or another output."""

    flag: str
    """The flag (or config key) that gave the output."""
    path: str
    other: str
    """The flag (or what) that gave the same file first."""
    kind: str
    """'an input' or 'another output'."""


def find_overlap(inputs: dict[str, str | None], outputs: dict[str, str | None]
                 ) -> Overlap | None:
    """The first output that is one of the inputs or another output, or None.

    Keys are the flags (or config keys) that gave each path; None values are skipped.
    """
    given_in = [(flag, path) for flag, path in inputs.items() if path]
    seen: list[tuple[str, str]] = []
    for flag, path in outputs.items():
        if not path:
            continue
        for other, other_path in given_in + seen:
            if _same_file(path, other_path):
                kind = "another output" if (other, other_path) in seen else "an input"
                return Overlap(flag, path, other, kind)
        seen.append((flag, path))
    return None


def refuse_unnamed(outputs: dict[str, str | None]) -> None:
    """Refuse an output given as "" or blank (the command would quietly write nothing, or
    a file named " ") or as "-" (a file named "-" in this folder, where a user may mean
    standard output)."""
    for flag, path in outputs.items():
        if path is not None and not path.strip():
            raise UserError(flag, "is empty", f"give {flag} a path, or leave it out")
        if path == "-":
            raise UserError(flag, "'-' would be a file named '-' here: ppsim writes its "
                            "files to paths, not to standard output", f"give {flag} a path "
                            "(--json prints the results on standard output)")


def refuse_overlap(inputs: dict[str, str | None], outputs: dict[str, str | None]) -> None:
    """Refuse (UserError naming both) an output that is one of the inputs or another
    output: `ppsim diff sim.json real.json --png real.json` would replace the real trace
    (and an output named "" or "-": refuse_unnamed)."""
    refuse_unnamed(outputs)
    if (o := find_overlap(inputs, outputs)) is not None:
        raise UserError(o.flag, f"{shown(o.path)} is also {o.other} ({o.kind}); ppsim never "
                        f"writes an output over {o.kind}", f"give {o.flag} a path of its own")
    refuse_unwritable(outputs)


def refuse_unwritable(outputs: dict[str, str | None]) -> None:
    """Refuse, before any work, an output path the write would refuse at the end: a
    directory, a symbolic link (without --force), a device, FIFO or socket, a folder
    that takes no new file (read-only, /proc); and one whose folder is missing (a typo
    there would otherwise leave a stray tree of folders)."""
    for flag, path in outputs.items():
        if path is None:
            continue
        try:
            _probe_folder(path, _target(path, force=False))
        except UserError as exc:
            raise UserError(flag, f"{exc.field}: {exc.problem}", exc.fix) from None


def _probe_folder(path: str, target: str) -> None:
    """Refuse a target whose folder is missing, or is one no file can be created in
    (tried: as root, permission bits say nothing about a read-only mount or /sys)."""
    folder, name = os.path.split(target)
    folder = folder or "."
    if not os.path.isdir(folder):
        what = "is not a directory" if os.path.lexists(folder) else "does not exist"
        raise _refuse(path, f"its folder {shown(folder)} {what}",
                      "create the folder first, or choose a path in an existing one")
    fd, tmp = _temp_beside(path, folder, name)
    os.close(fd)
    os.unlink(tmp)
