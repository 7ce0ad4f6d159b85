"""A Chrome trace's JSON read one event at a time, never as one tree.

`json.loads` of a trace holds every event as dicts, about five times the file
in memory (a 1 GiB trace at the size limit would need ~5 GB). Here the
top-level object is walked key by key and each `traceEvents` element is
decoded alone and handed to a callback that keeps only what it needs, so
memory stays near the text itself. Before any of it is decoded the text's
objects are counted (every `{`), and a trace of more than MAX_OBJECTS is
refused by that cost alone (120 MB of `{}` events took 13.5 s and 2.9 GB).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ppsim.errors import UserError

MAX_OBJECTS = 4_000_000
"""JSON objects in one trace (an event and its args are two): a simulated trace at
limits.TRACE (400k ops) holds ~2.3M. Measured on a 2-core machine: 1M compute events
(2M objects, 177 MB) read in 7.6 s at a peak of 384 MB, so this limit is ~15 s."""

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, i: int) -> int:
    return _SPACE.match(text, i).end()  # type: ignore[union-attr]  # matches the empty string


def _decode(text: str, i: int) -> tuple[Any, int]:
    return _DECODER.raw_decode(text, i)


def _expect(text: str, i: int, char: str) -> int:
    if not text.startswith(char, i):
        raise json.JSONDecodeError(f"Expecting '{char}'", text, i)
    return i + 1


def _events(text: str, i: int, on_event: Callable[[int, Any], None]) -> int:
    """Decode the array at i one element at a time; returns the index after it."""
    i = _skip(text, _expect(text, i, "["))
    if text.startswith("]", i):
        return i + 1
    n = 0
    while True:
        ev, i = _decode(text, i)
        on_event(n, ev)
        n += 1
        i = _skip(text, i)
        if text.startswith("]", i):
            return i + 1
        i = _skip(text, _expect(text, i, ","))


def _object(text: str, i: int, on_event: Callable[[int, Any], None]) -> tuple[dict, int]:
    """The top-level object's fields other than traceEvents (streamed to on_event)."""
    fields: dict[str, Any] = {}
    i = _skip(text, _expect(text, i, "{"))
    if text.startswith("}", i):
        return fields, i + 1
    while True:
        if not text.startswith('"', i):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes",
                                       text, i)
        key, i = _decode(text, i)
        i = _skip(text, _expect(text, _skip(text, i), ":"))
        if key == "traceEvents" and text.startswith("[", i):
            if "traceEvents" in fields:
                raise UserError("trace", "traceEvents appears twice", "re-record the trace")
            fields["traceEvents"] = True  # streamed, not kept
            i = _events(text, i, on_event)
        else:
            fields[key], i = _decode(text, i)
        i = _skip(text, i)
        if text.startswith("}", i):
            return fields, i + 1
        i = _skip(text, _expect(text, i, ","))


def scan(text: str, path: str, on_event: Callable[[int, Any], None],
         fix: str) -> dict[str, Any] | None:
    """Walk a trace document: each event of `traceEvents` (or of a bare top-level list)
    goes to on_event(n, event); returns the top-level fields but the events (None for a
    bare list, whose events are the whole document). Bad JSON is a UserError."""
    objects = text.count("{")
    if objects > MAX_OBJECTS:
        raise UserError("trace", f"{path} holds up to {objects:,} JSON objects, above the "
                        f"limit of {MAX_OBJECTS:,} (an event and its args are two)",
                        "record fewer iterations or microbatches")
    try:
        i = _skip(text, 0)
        if text.startswith("[", i):
            fields, i = None, _events(text, i, on_event)
        elif text.startswith("{", i):
            fields, i = _object(text, i, on_event)
        else:
            fields, i = _decode(text, i)  # a scalar: bad JSON reported, or not a trace
            fields = {"": fields}
        if _skip(text, i) != len(text):
            raise json.JSONDecodeError("Extra data", text, _skip(text, i))
    except json.JSONDecodeError as exc:
        raise UserError("trace", f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); "
                        "it may be truncated", fix) from None
    except RecursionError:
        raise UserError("trace", f"{path} is nested too deeply to be a Chrome trace",
                        "pass a trace written by ppsim simulate --trace or ppsim run") from None
    return fields
