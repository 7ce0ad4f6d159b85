"""Numbers as people read them: bytes with their unit."""

from __future__ import annotations


def fmt_bytes(n: float) -> str:
    """`n` bytes with a decimal unit (GB, MB, kB, B), two decimals."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
