"""tui/README.md's key table lists every key the app binds, and binds every key it lists."""

from __future__ import annotations

import re
from pathlib import Path

from ppsim.tui.app import PPSimApp
from ppsim.tui.screens import ConfirmQuit, HelpScreen, PathPrompt
from ppsim.tui.split_editor import SplitRows
from ppsim.tui.timeline import Timeline

README = Path(__file__).parents[2] / "tui" / "README.md"
CLASSES = (PPSimApp, SplitRows, Timeline, HelpScreen, ConfirmQuit, PathPrompt)
# Textual's own: focus next / previous, the command palette
TEXTUAL = {"tab", "shift+tab", "ctrl+p"}
# How the README writes a key Textual names otherwise
SHOWN = {"up": "↑", "down": "↓", "left": "←", "right": "→", "shift+left": "shift+←",
         "shift+right": "shift+→", "question_mark": "?", "slash": "/", "plus": "+",
         "minus": "-", "equals_sign": "=", "right_square_bracket": "]",
         "left_square_bracket": "[", "escape": "Escape", "enter": "Enter"}


def _table_keys() -> set[str]:
    """The keys the table's rows name: backticked, or Escape / Enter written out."""
    keys: set[str] = set()
    for line in README.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith(("| keys", "|---")):
            continue
        cell = line.split("|")[1]
        for quoted in re.findall(r"`([^`]+)`", cell):
            keys.update(quoted.split())
        keys.update(w for w in ("Escape", "Enter") if w in cell)
    return keys


def _bound() -> set[str]:
    return {SHOWN.get(k.strip(), k.strip()) for cls in CLASSES
            for b in cls.__dict__.get("BINDINGS", [])
            for k in (b.key if hasattr(b, "key") else b[0]).split(",")}


def test_every_binding_is_in_the_readme_table():
    missing = sorted(_bound() - _table_keys())
    assert not missing, f"tui/README.md's key table does not list {missing}"


def test_every_key_in_the_readme_table_is_bound():
    # Enter is an Input's own key (apply a setting)
    extra = sorted(_table_keys() - _bound() - TEXTUAL - {"Enter"})
    assert not extra, f"tui/README.md lists keys nothing binds: {extra}"
