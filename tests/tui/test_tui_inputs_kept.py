"""A save or an export never replaces a file the command line read: the --hardware
TOML (or a --deepspeed-config) is an input as much as the costs file is."""

from __future__ import annotations

import argparse
from pathlib import Path

from ppsim.cli.tui import add_arguments, build_app, opening_config
from ppsim.tui.testing import settle, status_text

HARDWARE = """[hardware]
preset = "cpu"
memory_bytes = 16000000000.0
peak_tflops = 0.04
"""


async def _write_through_prompt(pilot, key: str, path: Path) -> None:
    await pilot.press(key)
    await pilot.pause()
    pilot.app.screen.query_one("#prompt-input").value = str(path)
    await pilot.press("enter")
    await settle(pilot)


async def test_save_and_export_refuse_the_hardware_file(tmp_path: Path) -> None:
    hardware = tmp_path / "hw.toml"
    hardware.write_text(HARDWARE)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--hardware", str(hardware)])
    app = build_app(args, *opening_config(args))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("right")  # an edit worth saving
        await settle(pilot)
        for key in ("s", "e"):
            await _write_through_prompt(pilot, key, hardware)
            assert "never writes over what it read" in status_text(app), key
            assert hardware.read_text() == HARDWARE, key
