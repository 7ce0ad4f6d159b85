"""The help screen (? / f1) names every key the app binds, its aliases too."""

from __future__ import annotations

import re

from ppsim.tui.screens import HELP
from tests.tui.test_tui_readme_keys import _bound


def help_words() -> set[str]:
    """What the help says, as words: its markup and the legend's coloured swatches
    (" C " is a colour there, not a key) taken out; "↑/↓" and "shift+←/→" also as
    their halves."""
    plain = re.sub(r"\[on [^\]]*\][^\[]*\[/\]", " ", HELP)
    plain = re.sub(r"\[/?b\]", " ", plain).replace("\\[", "[")
    words: set[str] = set()
    for word in re.split(r"[\s,()]+", plain):
        halves = word.split("/") if len(word) > 1 else [word]
        words.update([word, *halves])
        if word.startswith("shift+") and "/" in word:  # shift+←/→: shift+← and shift+→
            words.update("shift+" + h.removeprefix("shift+") for h in halves)
    return words


def test_the_help_names_every_bound_key() -> None:
    missing = sorted(_bound() - help_words())
    assert not missing, f"the help (ppsim.tui.screens.HELP) does not name {missing}"
