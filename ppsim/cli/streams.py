"""Standard output that fails as a user error: full, closed, or in a narrow encoding.

`ppsim simulate --json > /dev/full`, a closed stdout (`>&-`) or
`PYTHONIOENCODING=ascii` must end in one line on stderr, never a traceback.
`guarded()` swaps sys.stdout for a proxy whose write and flush turn an OSError
into `StreamFailed`; `main` reports that. Characters the encoding cannot hold
are written as ASCII look-alikes (`…` as `...`), so the output stays readable.
"""

from __future__ import annotations

import codecs
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

ASCII_LOOKALIKES = {"…": "...", "×": "x", "→": "->", "←": "<-", "≤": "<=", "≥": ">=",
                    "−": "-", "–": "-", "—": "-", "·": ".", "µ": "u", "≈": "~", "✓": "ok",
                    "✗": "x", "█": "#", "▏": "|", "│": "|", "─": "-", "┃": "|", "━": "-",
                    "░": ":"}
"""What a character the output's encoding lacks is written as; others become '?'."""
ERRORS = "ppsim-ascii"


def _lookalike(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    return "".join(ASCII_LOOKALIKES.get(c, "?") for c in bad), exc.end


codecs.register_error(ERRORS, _lookalike)


class StreamFailed(Exception):
    """Standard output could not be written (the reason is the message)."""


class _Guarded:
    """sys.stdout with its write failures raised as StreamFailed."""

    def __init__(self, inner: TextIO | None) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if self._inner is None:
            raise AttributeError(name)
        return getattr(self._inner, name)

    @property
    def encoding(self) -> str:
        return getattr(self._inner, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self._inner is not None and self._inner.isatty()

    def _failed(self, exc: OSError | ValueError) -> StreamFailed:
        reason = getattr(exc, "strerror", None) or str(exc)
        return StreamFailed(f"cannot write standard output: {reason}")

    def write(self, text: str) -> int:
        if self._inner is None:
            raise StreamFailed("standard output is closed")
        try:
            return self._inner.write(text)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:  # ValueError: a closed file object
            raise self._failed(exc) from None

    def flush(self) -> None:
        if self._inner is None:
            return
        try:
            self._inner.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:
            raise self._failed(exc) from None


def _narrow_safe(stream: Any) -> None:
    """Write what the stream's encoding cannot hold as ASCII look-alikes."""
    encoding = getattr(stream, "encoding", None)
    if not encoding or not hasattr(stream, "reconfigure"):
        return
    try:
        "…".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        stream.reconfigure(errors=ERRORS)


@contextmanager
def guarded() -> Iterator[None]:
    """sys.stdout as a `_Guarded` proxy (restored after). The caller flushes it inside,
    where it catches StreamFailed, so a full disk is not met at interpreter exit."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            _narrow_safe(stream)
    original = sys.stdout
    sys.stdout = _Guarded(original)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = original


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so the interpreter's last flush of what
    could not be written does not fail again (with a traceback of its own)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
    except OSError:
        pass


def say(line: str) -> None:
    """One line on stderr, if stderr can take it."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(line)
            sys.stderr.flush()
    except (OSError, ValueError):
        pass
