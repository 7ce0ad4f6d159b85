"""A config written back as TOML, which ppsim.config.schema.load_config reads back to an
equal Config."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ppsim.config.schema import Config
from ppsim.pipeline.placement import PlacementConfig

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n",
            "\f": "\\f", "\r": "\\r"}


def toml_value(v: Any) -> str:
    """A TOML value: booleans, escaped strings, lists, numbers."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20
                             or ord(c) == 0x7F else c) for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def config_to_toml(cfg: Config) -> str:
    """Serialise a config so load_config reads it back to an equal Config."""
    lines = ["[model]"]
    tables = []
    for k, v in cfg.model.to_dict().items():
        if isinstance(v, dict):
            tables.append((f"model.{k}", v))
        else:
            lines.append(f"{k} = {toml_value(v)}")
    for name, table in tables:
        lines += ["", f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    sections: list[tuple[str, Any]] = [("pipeline", cfg.pipeline), ("hardware", cfg.hardware)]
    if cfg.placement != PlacementConfig():
        sections.append(("placement", cfg.placement))
    for section, obj in sections:
        lines += ["", *section_toml(section, obj)]
    lines += _memory_toml(cfg.memory)
    if cfg.costs_file:
        lines = [f"costs_file = {toml_value(cfg.costs_file)}", ""] + lines
    return "\n".join(lines) + "\n"


def section_toml(section: str, obj: Any) -> list[str]:
    """A config section (a dataclass) as its TOML table's lines, fields left unset out."""
    return [f"[{section}]"] + [f"{f.name} = {toml_value(v)}" for f in fields(obj)
                               if (v := getattr(obj, f.name)) is not None]


def _memory_toml(table: dict[str, Any] | None) -> list[str]:
    """The [memory] table and its [[memory.stage]] tables."""
    if table is None:
        return []
    lines = ["", "[memory]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()
                                if k != "stage"]
    for st in table.get("stage", []):
        lines += ["", "[[memory.stage]]"] + [f"{k} = {toml_value(v)}" for k, v in st.items()]
    return lines
