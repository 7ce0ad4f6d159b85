"""TUI responsiveness (issue 6): key press -> new numbers + timeline, and timeline redraws.

1. pp=8, 64 microbatches (llama3-70b, h100): time from a boundary-move key press
   in the split editor until the re-simulated numbers are applied and every
   visible timeline line has been rendered (goal: under 100 ms).
2. pp=16, 256 microbatches: time to redraw the visible timeline (cold cache:
   every line built; warm: served from the strip cache), at fit and zoomed in.

Run: .venv/bin/python benchmarks/bench_tui.py
"""

from __future__ import annotations

import asyncio
import statistics
import time

from textual import events

from ppsim.config import load_config
from tui.app import PPSimApp
from tui.testing import settle
from tui.timeline import Timeline

SIZE = (160, 50)
PRESSES = 20


def config(pp: int, microbatches: int):
    cfg = load_config(None)
    cfg.model = {"preset": "llama3-70b"}
    cfg.hardware.preset = None
    cfg.hardware.memory_bytes = 80e9
    cfg.pipeline.pp, cfg.pipeline.microbatches, cfg.pipeline.split = pp, microbatches, None
    return cfg


async def key_to_update(pp: int, microbatches: int) -> tuple[list[float], list[float]]:
    """Per press: (numbers applied + visible timeline lines rendered, app idle again)."""
    app = PPSimApp(config(pp, microbatches))
    updated, idle = [], []
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tl = app.query_one(Timeline)
        for i in range(PRESSES):
            before = app.results_applied
            key = "right" if i % 2 == 0 else "left"
            t0 = time.perf_counter()
            # the key event as the driver delivers it (Pilot.press would also wait for
            # every widget to go idle before returning)
            event = events.Key(key, None)
            event.set_sender(app)
            app._driver.send_message(event)
            while app.results_applied == before:
                if time.perf_counter() - t0 > 10:
                    raise RuntimeError("no re-simulation after the key press")
                await asyncio.sleep(0.0005)
            tl.text_lines()  # the visible lines the next frame shows
            updated.append(time.perf_counter() - t0)
            await pilot.pause()
            idle.append(time.perf_counter() - t0)
            await settle(pilot)
    return updated, idle


async def redraw(pp: int, microbatches: int) -> dict[str, float]:
    app = PPSimApp(config(pp, microbatches))
    out = {}
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tl = app.query_one(Timeline)
        for label, zoom in (("fit", 0), ("zoom x16", 4)):
            tl.action_fit()
            for _ in range(zoom):
                tl.action_zoom(0.5)
            await pilot.pause()
            cold = []
            for _ in range(10):
                tl._cache.clear()
                t0 = time.perf_counter()
                tl.text_lines()
                cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tl.text_lines()
            warm = time.perf_counter() - t0
            out[f"{label} cold"] = statistics.median(cold)
            out[f"{label} warm"] = warm
            out["lines"] = tl.size.height
    return out


def main() -> None:
    t, idle = asyncio.run(key_to_update(8, 64))
    print(f"pp=8, 64 microbatches, {PRESSES} presses: key -> numbers + timeline lines: "
          f"median {statistics.median(t) * 1e3:.1f} ms, max {max(t) * 1e3:.1f} ms "
          f"(goal < 100 ms); key -> app idle: median {statistics.median(idle) * 1e3:.1f} ms, "
          f"max {max(idle) * 1e3:.1f} ms")
    r = asyncio.run(redraw(16, 256))
    lines = int(r.pop("lines"))
    for k, v in r.items():
        print(f"pp=16, 256 microbatches: timeline redraw ({lines} lines) {k}: {v * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
