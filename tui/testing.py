"""Helpers for driving the app headlessly (Pilot tests and the benchmark)."""

from __future__ import annotations

from typing import Any

SIZE = (120, 40)
"""The terminal size the tests and the rendered-text goldens use."""


async def settle(pilot: Any) -> None:
    """Wait until every worker (simulation, planner) finished and the screen caught up."""
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def screen_text(app: Any) -> list[str]:
    """The whole screen as plain text lines (what a user would read)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]
