"""Argparse types for flag values that name something: a preset, a file, a builder. An
empty value ("--preset ''", "--costs=", a bash variable left unset) is refused in the
flag's name, not read as "not given"."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def nonempty(what: str) -> Callable[[str], str]:
    """The argparse type of a flag whose value names `what`: the value, or refused when
    it is empty or blank."""

    def value(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty (give {what}, or leave the flag out)")
        return text

    value.__name__ = what  # argparse names the type in some of its own messages
    return value
