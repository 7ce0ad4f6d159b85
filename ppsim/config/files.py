"""Input files read bounded and output paths checked: one home for how ppsim opens
what a user hands it (configs, cost files, traces, action CSVs) and for strict JSON.

A FIFO, a device, a directory or a runaway file is refused before it is read; every
failure is a `UserError` naming the flag. No torch.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from ppsim.errors import UserError

MAX_CONFIG_BYTES = 1 << 20
MAX_COSTS_BYTES = 64 << 20
"""A cost file holds at most limits.MAX_LAYERS entries of ~200 bytes."""
MAX_TRACE_BYTES = 1 << 30


# ------------------------------------------------------------------ files


def readable_file(flag: str, path: str, max_bytes: int, what: str) -> None:
    """Refuse, before reading, what is not a regular file or is larger than max_bytes
    (a device such as /dev/zero, a FIFO, a directory, a runaway file)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UserError(flag, f"cannot read {path!r}: {reason}", f"pass an existing {what}"
                        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(flag, f"{path!r} is not a regular file", f"pass a {what}")
    if st.st_size > max_bytes:
        raise UserError(flag, f"{path!r} is {st.st_size / 1e6:,.1f} MB, above the limit of "
                        f"{max_bytes / 1e6:,.0f} MB for a {what}", f"pass a smaller {what}")


def open_regular(flag: str, path: str, max_bytes: int, what: str) -> BinaryIO:
    """The file opened for reading, once `readable_file` accepts it; UserError otherwise."""
    readable_file(flag, path, max_bytes, what)
    try:
        # O_NONBLOCK: a FIFO swapped in after the check opens at once instead of blocking
        # until a writer comes; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UserError(flag, f"cannot read {path!r}: {exc.strerror}", f"pass a readable {what}"
                        ) from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise UserError(flag, f"{path!r} is not a regular file", f"pass a {what}")
    return fh


def read_text(flag: str, path: str, max_bytes: int, what: str) -> str:
    """A small UTF-8 text file, every failure a UserError naming flag."""
    with open_regular(flag, path, max_bytes, what) as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise UserError(flag, f"cannot read {path!r}: {exc.strerror}",
                            f"pass a readable {what}") from None
    if len(data) > max_bytes:  # it grew since stat
        raise UserError(flag, f"{path!r} is above the limit of {max_bytes / 1e6:,.0f} MB",
                        f"pass a smaller {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(flag, f"{path!r} is not UTF-8 text (byte {exc.start})",
                        f"save the {what} as UTF-8") from None


def text_lines(flag: str, path: str, max_bytes: int, what: str, piece: int = 2**20
               ) -> Iterator[str]:
    """A UTF-8 text file's lines (a BOM dropped, line ends kept), read as they are used,
    so a reader that parses line by line holds no copy of the file; a line longer than
    `piece` characters comes in pieces (only the last ends in the line end), so a reader
    can refuse a runaway line before it is all decoded. The file is refused as
    `open_regular` refuses, and every failure while reading is a UserError naming flag.
    Close it (contextlib.closing) when stopping early."""
    with open_regular(flag, path, max_bytes, what) as fh:
        stream = io.TextIOWrapper(fh, encoding="utf-8-sig", newline="")
        chars = 0
        try:
            while line := stream.readline(piece):
                chars += len(line)
                if chars > max_bytes:  # it grew since stat (a character is a byte or more)
                    raise UserError(flag, f"{path!r} is above the limit of "
                                    f"{max_bytes / 1e6:,.0f} MB", f"pass a smaller {what}")
                yield line
        except UnicodeDecodeError as exc:
            raise UserError(flag, f"{path!r} is not UTF-8 text (byte {exc.start} of a read)",
                            f"save the {what} as UTF-8") from None
        except OSError as exc:
            raise UserError(flag, f"cannot read {path!r}: {exc.strerror}",
                            f"pass a readable {what}") from None


class _RepeatedKey(ValueError):
    """A JSON object names one key twice (its first value would be silently lost)."""


def _unrepeated(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # As TOML refuses a repeated key, and DeepSpeed its own config with one.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _RepeatedKey(key)
        obj[key] = value
    return obj


def read_json(flag: str, path: str, max_bytes: int, what: str, fix: str,
              nested_fix: str | None = None, max_containers: int | None = None) -> Any:
    """A small JSON file (read as `read_text` does); bad JSON, an object that repeats a
    key, or JSON nested past what the parser recurses through, is a UserError naming
    flag with `fix` (or `nested_fix`).
    With `max_containers`, a file of more objects and arrays than that is refused before
    it is parsed (each costs ~60 bytes parsed: 64 MB of `{}` would take 1.7 GB)."""
    text = read_text(flag, path, max_bytes, what)
    if max_containers is not None:
        found = text.count("{") + text.count("[")
        if found > max_containers:
            raise UserError(flag, f"{path} holds up to {found:,} JSON objects and arrays, "
                            f"above the {max_containers:,} a {what} can need", fix)
    try:
        return json.loads(text, object_pairs_hook=_unrepeated)
    except _RepeatedKey as exc:
        raise UserError(flag, f"{path} gives the key {exc.args[0]!r} twice in one object "
                        "(JSON would keep only the last)", "keep one of them") from None
    except json.JSONDecodeError as exc:
        raise UserError(flag, f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); "
                        "it may be truncated", fix) from None
    except RecursionError:
        raise UserError(flag, f"{path} is nested too deeply to be a {what}",
                        nested_fix or fix) from None


@contextmanager
def output(flag: str, path: str) -> Iterator[None]:
    """Turn an OSError while writing path (too long a name, /proc, a full disk), or a
    refusal of ppsim.fileio (a directory, a device), into a UserError naming the flag."""
    try:
        yield
    except UserError as exc:  # ppsim.fileio's refusals name the path; add the flag
        if exc.field == flag:
            raise
        raise UserError(flag, f"{exc.field}: {exc.problem}", exc.fix) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UserError(flag, f"cannot write {path!r}: {reason}"[:300],
                        "choose a writable file path") from None


# ------------------------------------------------------------------ JSON output


def finite_json(obj: Any) -> Any:
    """obj with every non-finite float replaced by None, so strict JSON parsers read it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj
