"""One setting under two of its names: ppsim's and Megatron's (`--pp` and
`--pipeline-model-parallel-size`), Megatron's old and new (`--hybrid-override-pattern`),
or two switches that set it (`--use-torch-fsdp2`, `--use-megatron-fsdp`). argparse keeps
the last one given; a line that gives two values under two names (`ppsim plan --pp 8
$MODEL_PARALLEL_ARGS`, the script's size 4) is refused, naming both. The same name twice
keeps the last, as Megatron's own parser does."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ppsim.errors import UserError


def _sets(action: argparse.Action) -> dict[str, Any]:
    """The fields a switch that sets several at once sets (job_flags._Sets), else {}."""
    fields = getattr(action, "fields", None)
    return fields if isinstance(fields, dict) else {}


def _aliased_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each long option that takes one value or sets fields, where a setting it gives
    has another such name."""
    by_dest: dict[str, set[str]] = {}
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list
        dests = list(_sets(action)) or ([action.dest] if action.nargs is None else [])
        for name in (o for o in action.option_strings if o.startswith("--")):
            actions[name] = action
            for dest in dests:
                by_dest.setdefault(dest, set()).add(name)
    return {n: actions[n] for names in by_dest.values() if len(names) > 1 for n in names}


def _value(action: argparse.Action, text: str) -> Any:
    """`text` as argparse reads it for `action` (the text itself where it cannot)."""
    try:
        return action.type(text) if callable(action.type) else text
    except (ValueError, TypeError, argparse.ArgumentTypeError, UserError):
        return text


def _given(names: dict[str, argparse.Action], words: Sequence[str]
           ) -> dict[str, dict[str, tuple[str, Any]]]:
    """dest -> {name: (how it was given, the last value given under it)}."""
    given: dict[str, dict[str, tuple[str, Any]]] = {}
    for i, word in enumerate(words):
        if word == "--":
            break
        name, eq, text = word.partition("=")
        action = names.get(name)
        if action is None:
            continue
        if _sets(action):
            values = {dest: (name, v) for dest, v in _sets(action).items()}
        elif eq or i + 1 < len(words):
            text = text if eq else words[i + 1]
            values = {action.dest: (f"{name} {text}", _value(action, text))}
        else:
            continue
        for dest, value in values.items():
            given.setdefault(dest, {}).pop(name, None)
            given[dest][name] = value
    return given


def refuse_two_values(parser: argparse.ArgumentParser, words: Sequence[str]) -> None:
    """Refuse one setting given two different values under two of its names."""
    for dest, values in _given(_aliased_names(parser), words).items():
        (shown, value), *rest = values.values()
        for other, other_value in rest:
            if other_value != value:
                raise UserError(other, f"disagrees with {shown}: both set {dest}",
                                "give one of them, or the same value to both")
