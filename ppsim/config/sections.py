"""Which section each config key belongs in.

TOML files every key under the last `[table]` header above it, so a top-level key written
below `[model]`, or a pipeline key under `[hardware]`, lands in the wrong table; a key
that is not valid where it stands but is valid in another section is refused naming its
home, instead of a list of the valid keys where it stands.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ppsim.errors import UserError

TOP_LEVEL = ""
"""The name `homes` gives the top level (keys above every header, e.g. costs_file)."""


def check_homes(data: Mapping[str, Any], homes: Mapping[str, Collection[str]]) -> None:
    """Refuse the first key of `data` (a parsed config) that stands where it is not valid
    and is valid in another section. `homes`: each section's valid keys, TOP_LEVEL's too."""
    for key in data:
        if key not in homes and key not in homes[TOP_LEVEL]:
            _refuse_if_elsewhere(TOP_LEVEL, key, homes)
    for section, table in data.items():
        if section == TOP_LEVEL or section not in homes or not isinstance(table, dict):
            continue
        for key in table:
            if key not in homes[section]:
                _refuse_if_elsewhere(section, key, homes)


def _refuse_if_elsewhere(section: str, key: str, homes: Mapping[str, Collection[str]]) -> None:
    others = [s for s, keys in homes.items() if s != section and key in keys]
    if not others:
        return  # unknown everywhere: the section's own check suggests the closest key
    there = " or ".join(_name(s) for s in others)
    fix = ("move it above the first [table] header" if others == [TOP_LEVEL]
           else f"move it under {there}")
    raise UserError(f"{section}.{key}" if section else key,
                    f"belongs in {there}, not in {_name(section)}", fix)


def _name(section: str) -> str:
    return "the top level" if section == TOP_LEVEL else f"[{section}]"
