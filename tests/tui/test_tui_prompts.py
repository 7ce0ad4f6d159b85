"""The prompts (e export, s save, t trace, B pin typed, / find) show their whole title
at 80x24 and 160x45, wrapped where it is long, their field under it, and an input hint
that fits what they ask for (a path, a split, a search)."""

from __future__ import annotations

import re

from textual.widgets import Input, Label

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import preset_config, screen_text, settle

KEYS = {"e": "path", "s": "path", "t": "path", "B": "split", "slash": "r3 b12"}
"""Each prompt's key and a word its input's hint holds."""


def words(text: str) -> str:
    """Text as words: box and field edges taken out, each run of spaces one."""
    return re.sub(r"\s+", " ", re.sub(r"[█▀▄▊▎▔▁│]", " ", text)).strip()


async def test_every_prompt_shows_its_whole_title_and_a_fitting_hint() -> None:
    app = PPSimApp(preset_config("llama3-70b", 8, 32))
    for size in ((80, 24), (160, 45)):
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            for key, hint in KEYS.items():
                await pilot.press(key)
                await settle(pilot)
                title = str(app.screen.query_one("#prompt-title", Label).render())
                box = app.screen.query_one("#prompt-box").region
                shown = words(" ".join(line[box.x:box.right] for line in
                                       screen_text(app)[box.y:box.bottom]))
                assert words(title) in shown, (size, key, title)
                # the field under a long preview (e's export) stays in view at 80x24
                assert "Enter to confirm, Escape to cancel" in shown, (size, key)
                assert hint in app.screen.query_one(Input).placeholder, (key, hint)
                await pilot.press("escape")
                await settle(pilot)
        app = PPSimApp(preset_config("llama3-70b", 8, 32))


async def test_the_pin_prompts_examples_are_splits_of_the_pipeline_on_screen() -> None:
    """`B`'s examples are the split on screen (counts and layout), each pinnable as it
    stands, at pp 4 as at pp 8: an 8-stage example is refused at pp 4."""
    from ppsim.plan.references import parse_reference

    app = PPSimApp(preset_config("llama3-70b", 4, 16))
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        await pilot.press("B")
        await settle(pilot)
        title = str(app.screen.query_one("#prompt-title", Label).render())
        problem = app.result.sim.problem
        counts, layout = re.search(r": ([\d,]+) or '([^']+)'", title).groups()
        for text in (counts, layout):
            assert parse_reference(text, problem).counts == problem.split.counts, text
