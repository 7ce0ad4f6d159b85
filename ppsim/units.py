"""Numbers as people read them: bytes with their unit."""

from __future__ import annotations

UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def byte_unit(n: float) -> tuple[str, float]:
    """The decimal unit `n` bytes read in, and its size: ("MB", 1e6) for 5e7."""
    return next(((u, size) for u, size in UNITS if abs(n) >= size), ("B", 1.0))


def fmt_bytes(n: float, figures: int = 0) -> str:
    """`n` bytes with a decimal unit (GB, MB, kB, B): two decimals, or `figures`
    significant figures (755 MB, 9.66 GB) where columns are narrow."""
    unit, size = byte_unit(n)
    if size == 1.0:
        return f"{n:.0f} B"
    v = n / size
    if not figures:
        return f"{v:.2f} {unit}"
    return f"{v:.{max(0, figures - len(str(int(abs(v)))))}f} {unit}"
