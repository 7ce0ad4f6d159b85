"""A Chrome trace's JSON read one event at a time, never as one tree nor one string.

`json.loads` of a trace holds every event as dicts, about five times the file
in memory (a 1 GiB trace at the size limit would need ~5 GB). Here the file is
read in chunks, the top-level object is walked key by key, and each
`traceEvents` element is decoded alone and handed to a callback that keeps only
what it needs, so memory stays near what the callback keeps plus one chunk.
Before any of it is decoded the file's objects are counted (every `{`), and a
trace of more than MAX_OBJECTS is refused by that cost alone (120 MB of `{}`
events took 13.5 s and 2.9 GB).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from typing import Any, BinaryIO

from ppsim.errors import UserError

MAX_OBJECTS = 4_000_000
"""JSON objects in one trace (an event and its args are two): a simulated trace at
limits.TRACE (400k ops) holds ~2.3M. Measured on a 2-core machine: 1M compute events
(2M objects, 160 MB) read in ~8 s, so this limit is ~15 s."""
CHUNK = 4 << 20
"""Bytes read at a time."""

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def count_objects(fh: BinaryIO, path: str, max_bytes: int) -> int:
    """Every `{` of the file (an upper bound on its objects), read in chunks; rewinds.
    A file that grew past max_bytes since it was checked is refused."""
    found = size = 0
    while chunk := fh.read(CHUNK):
        found += chunk.count(b"{")
        size += len(chunk)
        if size > max_bytes:
            raise UserError("trace", f"{path} is above the limit of {max_bytes / 1e6:,.0f} MB",
                            "pass a smaller trace")
    fh.seek(0)
    return found


class _Text:
    """The part of the file not yet parsed, topped up a chunk at a time."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()  # a BOM dropped
        self.text = ""
        self.eof = False
        self.more()

    def more(self) -> bool:
        """Append the next chunk; False at the end of the file."""
        if self.eof:
            return False
        data = self.fh.read(CHUNK)
        self.eof = not data
        self.text += self.decoder.decode(data, final=self.eof)
        return not self.eof

    def keep_from(self, i: int) -> int:
        """Drop what is parsed (before i); returns i's index in the kept text."""
        if i > CHUNK:
            self.text = self.text[i:]
            return 0
        return i

    def skip(self, i: int) -> int:
        """The index of the next non-space character (or the end, at the end of file)."""
        while True:
            i = _SPACE.match(self.text, i).end()  # type: ignore[union-attr]  # matches ""
            if i < len(self.text) or not self.more():
                return i

    def at(self, i: int, char: str) -> bool:
        i = self.skip(i)
        return self.text.startswith(char, i)

    def expect(self, i: int, char: str) -> int:
        i = self.skip(i)
        if not self.text.startswith(char, i):
            raise json.JSONDecodeError(f"Expecting '{char}'", self.text, i)
        return i + 1

    def value(self, i: int) -> tuple[Any, int]:
        """One JSON value from i, reading on while it is cut by the end of the text (or
        ends exactly there, as a number cut in two would)."""
        i = self.skip(i)
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, i)
            except json.JSONDecodeError:
                if self.more():
                    continue
                raise
            if end < len(self.text) or not self.more():
                return value, end


def _events(t: _Text, i: int, on_event: Callable[[int, Any], None]) -> int:
    """Decode the array at i one element at a time; returns the index after it."""
    i = t.expect(i, "[")
    if t.at(i, "]"):
        return t.skip(i) + 1
    n = 0
    while True:
        ev, i = t.value(t.keep_from(i))
        on_event(n, ev)
        n += 1
        if t.at(i, "]"):
            return t.skip(i) + 1
        i = t.expect(i, ",")


def _object(t: _Text, i: int, on_event: Callable[[int, Any], None]) -> tuple[dict, int]:
    """The top-level object's fields other than traceEvents (streamed to on_event)."""
    fields: dict[str, Any] = {}
    i = t.expect(i, "{")
    if t.at(i, "}"):
        return fields, t.skip(i) + 1
    while True:
        if not t.at(i, '"'):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes",
                                       t.text, t.skip(i))
        key, i = t.value(i)
        i = t.expect(i, ":")
        if key == "traceEvents" and t.at(i, "["):
            if "traceEvents" in fields:
                raise UserError("trace", "traceEvents appears twice", "re-record the trace")
            fields["traceEvents"] = True  # streamed, not kept
            i = _events(t, i, on_event)
        else:
            fields[key], i = t.value(i)
        if t.at(i, "}"):
            return fields, t.skip(i) + 1
        i = t.expect(i, ",")


def scan(fh: BinaryIO, path: str, on_event: Callable[[int, Any], None], fix: str,
         max_bytes: int) -> dict[str, Any] | None:
    """Walk a trace document: each event of `traceEvents` (or of a bare top-level list)
    goes to on_event(n, event); returns the top-level fields but the events (None for a
    bare list, whose events are the whole document). Bad JSON or UTF-8 is a UserError."""
    objects = count_objects(fh, path, max_bytes)
    if objects > MAX_OBJECTS:
        raise UserError("trace", f"{path} holds up to {objects:,} JSON objects, above the "
                        f"limit of {MAX_OBJECTS:,} (an event and its args are two)",
                        "record fewer iterations or microbatches")
    try:
        t = _Text(fh)
        fields: dict[str, Any] | None
        if t.at(0, "["):
            fields, i = None, _events(t, 0, on_event)
        elif t.at(0, "{"):
            fields, i = _object(t, 0, on_event)
        else:
            scalar, i = t.value(0)  # bad JSON reported, or not a trace
            fields = {"": scalar}
        if t.skip(i) != len(t.text):
            raise json.JSONDecodeError("Extra data", t.text, t.skip(i))
    except json.JSONDecodeError as exc:
        raise UserError("trace", f"{path} is not valid JSON ({exc.msg}); it may be truncated",
                        fix) from None
    except UnicodeDecodeError as exc:
        raise UserError("trace", f"{path} is not UTF-8 text ({exc.reason})",
                        "save the trace as UTF-8") from None
    except RecursionError:
        raise UserError("trace", f"{path} is nested too deeply to be a Chrome trace",
                        "pass a trace written by ppsim simulate --trace or ppsim run") from None
    return fields
