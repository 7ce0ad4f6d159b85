"""Helpers for driving the app headlessly (Pilot tests and the benchmark)."""

from __future__ import annotations

import time
from typing import Any

from ppsim.config.model import parse_model
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import Config, load_config

SIZE = (120, 40)
"""The terminal size the tests and the rendered-text goldens use."""


async def settle(pilot: Any) -> None:
    """Wait until every worker (simulation, planner) finished and the screen caught up:
    again while a pause started another (the app starts a large state's simulation after
    the next refresh, which a pause brings)."""
    from textual.worker import WorkerState

    await pilot.pause()
    while True:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if not any(w.state in (WorkerState.PENDING, WorkerState.RUNNING)
                   for w in pilot.app.workers):
            return


async def settle_until(pilot: Any, done: Any, timeout_s: float = 120.0) -> None:
    """settle() until `done()` holds (a planner in a child process may outlast one
    settle on a loaded machine); AssertionError with the status line after timeout_s."""
    deadline = time.monotonic() + timeout_s
    await settle(pilot)
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {timeout_s:g} s: {status_text(pilot.app)}")
        await pilot.pause(0.05)
        await settle(pilot)


def screen_text(app: Any) -> list[str]:
    """The whole screen as plain text lines (what a user would read)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def preset_config(preset: str, pp: int, microbatches: int, vpp: int = 1,
                  schedule: str = "1f1b") -> Config:
    """The embedded default with a model preset on H100s, the even split (as
    `--preset ... --hardware h100-80gb --pp ...` sets it)."""
    return with_overrides(load_config(None), preset=preset, hardware="h100-80gb",
                          pipeline={"pp": pp, "vpp": vpp, "microbatches": microbatches,
                                    "schedule": schedule}, split={})


def preset_on_default(preset: str, pp: int, microbatches: int,
                      memory_bytes: float | None = None) -> Config:
    """The embedded default (its hardware) with a model preset, pp stages and the even
    split; `memory_bytes` the limit where given."""
    cfg = load_config(None)
    cfg.model = parse_model({"preset": preset})
    if memory_bytes is not None:
        cfg.hardware.memory_bytes = memory_bytes
    cfg.pipeline.pp, cfg.pipeline.microbatches, cfg.pipeline.split = pp, microbatches, None
    return cfg


def status_text(app: Any) -> str:
    """The status line's message (on a screen without one: the whole screen's text)."""
    found = app.query("#status")
    return found.first().text if found else "\n".join(screen_text(app))


def on_screen(app: Any, selector: str, size: tuple[int, int]) -> bool:
    """The widget is on screen, whole, with room for content (not pushed off)."""
    region = app.query_one(selector).region
    return region.height >= 3 and region.y >= 0 and region.bottom <= size[1]
