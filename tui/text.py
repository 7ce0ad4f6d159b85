"""Plain text helpers for narrow columns: cut text is marked with `…`, lists of
counts keep their brackets, large counts get thousands separators.

No Textual here (unit-tested as plain functions).
"""

from __future__ import annotations

from collections.abc import Sequence

ELLIPSIS = "…"


def cut(text: str, width: int) -> str:
    """`text` in at most `width` columns; when it does not fit, its end is replaced
    by `…` so a reader sees that something is missing."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[:width - 1] + ELLIPSIS


def counts_text(counts: Sequence[int], width: int | None = None) -> str:
    """`[10, 10, 9]`, or within `width` columns `[10, 10, …, 9, 9]`: the first and
    last counts kept, the brackets always there (a cut list never looks whole);
    `[10, …, 9]` when even that is wider (the whole list where that is no shorter)."""
    full = "[" + ", ".join(str(c) for c in counts) + "]"
    if width is None or len(full) <= width:
        return full
    items = [str(c) for c in counts]
    for keep in range(len(items) // 2, 0, -1):
        text = "[" + ", ".join(items[:keep] + [ELLIPSIS] + items[-keep:]) + "]"
        if len(text) <= width:
            return text
    shortest = "[" + ", ".join([items[0], ELLIPSIS, items[-1]]) + "]"  # brackets kept
    # Two or three counts: an ellipsis would hide nothing, so the whole list it is.
    return shortest if len(shortest) < len(full) else full


def thousands(n: int) -> str:
    """A count as the CLI prints it: 5,843,355,957."""
    return f"{n:,}"


def one_line(text: str) -> str:
    """A message on one line (its line breaks become ` · `)."""
    return " · ".join(part.strip() for part in text.splitlines() if part.strip())
