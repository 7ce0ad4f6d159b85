"""Write tui/screenshot.svg (the picture in tui/README.md): Llama-3-70B on 8 H100
ranks, 32 microbatches, an uneven split against the even one, as `ppsim tui` draws it.

Run: .venv/bin/python scripts/tui_screenshot.py
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from ppsim.config.overrides import with_overrides
from ppsim.config.schema import load_config
from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import settle

SPLIT = (9, 11, 11, 11, 11, 11, 11, 5)
SIZE = (120, 40)
OUT = Path(__file__).parents[1] / "tui" / "screenshot.svg"


async def main() -> None:
    cfg = with_overrides(load_config(None), preset="llama3-70b", hardware="h100-80gb",
                         pipeline={"pp": 8, "microbatches": 32}, split={})
    app = PPSimApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.set_state(replace(app.state, counts=SPLIT), field="split")
        await settle(pilot)
        app.query_one("#timeline").focus()
        await pilot.pause()
        app.save_screenshot(str(OUT.name), str(OUT.parent))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    asyncio.run(main())
