"""The warning lines under the headline: an edit of vpp or microbatches that Megatron
would refuse shows the line `ppsim simulate` prints on stderr, whole (wrapped, never
cut) at 80x24 to 160x45 with every panel still on screen, and the edit that fixes it
takes it away."""

from __future__ import annotations

import pytest
from test_tui_render import check_golden

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import SIZE, on_screen, screen_text, settle, status_text
from ppsim.tui.warning_bar import WarningBar

REFUSED = "warning: Megatron refuses this interleaved order"
DEFAULT_GROUP = "warning: Megatron refuses 3 microbatches with its default group size"


async def _set(pilot: object, app: PPSimApp, field: str, value: str) -> None:
    inp = app.query_one(f"#set-{field}")
    inp.focus()
    inp.value = value  # type: ignore[attr-defined]
    await pilot.press("enter")  # type: ignore[attr-defined]
    await settle(pilot)
    assert str(getattr(app.state, field)) == value, status_text(app)


def bar_text(app: PPSimApp) -> str:
    """The warning lines as the screen shows them, the wrapped rows joined again."""
    region = app.query_one(WarningBar).region
    rows = screen_text(app)[region.y:region.bottom]
    return " ".join(" ".join(row[region.x:region.right].split()) for row in rows)


def all_on_screen(app: PPSimApp, size: tuple[int, int]) -> None:
    """The bar shows its lines whole and pushes no panel off the screen."""
    bar = app.query_one(WarningBar)
    assert bar.display and bar_text(app) == " ".join(bar.lines)
    for panel in ("#settings", "#split-editor", "#timeline", "#compare-box"):
        assert on_screen(app, panel, size), panel
    status, footer = screen_text(app)[-2:]
    assert "help" in status and "palette" in footer


@pytest.mark.parametrize("size", [(80, 24), SIZE, (160, 45)])
async def test_a_refused_order_is_said_under_the_headline_until_fixed(
        size: tuple[int, int]) -> None:
    app = PPSimApp()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        bar = app.query_one(WarningBar)
        await _set(pilot, app, "vpp", "2")  # pp 2, m 8: Megatron runs it
        assert not bar.display and "Megatron" not in "\n".join(screen_text(app))
        await _set(pilot, app, "microbatches", "1")  # m < pp
        assert bar.lines == app.result.warnings and len(bar.lines) == 1
        assert bar.lines[0].startswith(REFUSED) and "outside [pp=2, m=1]" in bar.lines[0]
        all_on_screen(app, size)
        await _set(pilot, app, "vpp", "1")  # 1F1B: no interleaved order to refuse
        assert not bar.display and "Megatron" not in "\n".join(screen_text(app))
        await _set(pilot, app, "vpp", "2")
        await _set(pilot, app, "microbatches", "3")  # Megatron's default group of 2
        assert len(bar.lines) == 1 and bar.lines[0].startswith(DEFAULT_GROUP)
        all_on_screen(app, size)
        await _set(pilot, app, "microbatches", "4")
        assert not bar.display and bar.lines == ()


async def test_the_warning_at_80x24() -> None:
    """The longest line (Megatron's default group, with the flag that fixes it) wraps
    over the full width; the split panel scrolls under it."""
    app = PPSimApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await _set(pilot, app, "vpp", "2")
        await _set(pilot, app, "microbatches", "3")
        check_golden("main_warning_80x24.txt", screen_text(app))
