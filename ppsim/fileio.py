"""Atomic file writes: a crash never leaves half a file behind."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(tmp: str, path: str) -> None:
    """mkstemp makes 0600 files; give the result the usual permissions, then rename."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def write_text_atomic(path: str, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over path."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        _publish(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, separators=(",", ":")) + "\n")
