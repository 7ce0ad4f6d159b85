"""Cache keys for a config's values: checks and parses that are pure functions of the
values run once per distinct value (a job search builds a config per shape)."""

from __future__ import annotations

from typing import Any


def frozen_items(values: dict[str, Any]) -> tuple[tuple[str, type, Any], ...] | None:
    """`values` as a cache key from which they read back: each name with its value's
    type, so that 1, 1.0 and True stay apart (they hash alike, and a check may refuse one
    and take another); None when a value is unhashable (a list)."""
    key = tuple(sorted((k, type(v), v) for k, v in values.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def value_key(obj: Any) -> tuple[Any, ...] | None:
    """An object's attributes as a cache key (typed as frozen_items, lists as tuples),
    for a check that only needs to know the values were seen; None when a value is
    still unhashable."""
    try:  # an object without a __dict__ (slots) has no key either
        key = tuple((k, _frozen(v)) for k, v in sorted(vars(obj).items()))
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(v: Any) -> Any:
    if isinstance(v, list):
        return (list, tuple(_frozen(x) for x in v))
    return (type(v), v)
