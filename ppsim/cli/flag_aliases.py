"""One setting under two of its names: ppsim's and Megatron's (`--pp` and
`--pipeline-model-parallel-size`), or Megatron's old and new (`--hybrid-override-pattern`).
argparse keeps the last one given; a line that gives two values under two names
(`ppsim plan --pp 8 $MODEL_PARALLEL_ARGS`, the script's size 4) is refused, naming both.
The same name twice keeps the last, as Megatron's own parser does."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ppsim.errors import UserError


def _single_value_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each long option that takes one value, where its setting has another such name."""
    by_dest: dict[str, list[tuple[str, argparse.Action]]] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list
        if action.nargs is None and action.option_strings:
            by_dest.setdefault(action.dest, []).extend(
                (o, action) for o in action.option_strings if o.startswith("--"))
    return {o: a for names in by_dest.values() if len(names) > 1 for o, a in names}


def _value(action: argparse.Action, text: str) -> Any:
    """`text` as argparse reads it for `action` (the text itself where it cannot)."""
    try:
        return action.type(text) if callable(action.type) else text
    except (ValueError, TypeError, argparse.ArgumentTypeError, UserError):
        return text


def _given(names: dict[str, argparse.Action], words: Sequence[str]
           ) -> dict[str, dict[str, Any]]:
    """dest -> {name: the last value given under it}."""
    given: dict[str, dict[str, Any]] = {}
    for i, word in enumerate(words):
        if word == "--":
            break
        name, eq, text = word.partition("=")
        action = names.get(name)
        if action is None or (not eq and i + 1 >= len(words)):
            continue
        value = _value(action, text if eq else words[i + 1])
        given.setdefault(action.dest, {}).pop(name, None)
        given[action.dest][name] = value
    return given


def refuse_two_values(parser: argparse.ArgumentParser, words: Sequence[str]) -> None:
    """Refuse one setting given two different values under two of its names."""
    for values in _given(_single_value_names(parser), words).values():
        (first, a), *rest = values.items()
        for second, b in rest:
            if a != b:
                raise UserError(second, f"{b} disagrees with {first} {a}, another name for "
                                "the same setting", "give one of them, or the same value to "
                                "both")
