"""The TUI's export of an interleaved split: Megatron runs a vpp > 1 split in its
interleaved order, so the flags carry the microbatch group the simulated order uses where
it is not Megatron's default (pp), and say where Megatron refuses that order at all."""

from __future__ import annotations

import shlex
from pathlib import Path

from ppsim.tui.app import PPSimApp
from ppsim.tui.exports import read_export
from ppsim.tui.testing import SIZE, settle, status_text

GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


async def _export(tmp_path: Path, microbatches: int) -> str:
    """The default state (pp 2) at vpp 2 and `microbatches`, exported with `e`."""
    app = PPSimApp()
    out = tmp_path / "split.sh"
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for field, value in (("#set-vpp", "2"), ("#set-microbatches", str(microbatches))):
            inp = app.query_one(field)
            inp.focus()
            inp.value = value
            await pilot.press("enter")
            await settle(pilot)
        assert (app.state.vpp, app.state.microbatches) == (2, microbatches), status_text(app)
        await pilot.press("e")
        await pilot.pause()
        app.screen.query_one("#prompt-input").value = str(out)
        await pilot.press("enter")
        await settle(pilot)
    return out.read_text()


async def test_the_export_passes_the_group_megatron_needs(tmp_path: Path) -> None:
    """pp 2, m 3: Megatron's default group (2) leaves a last group of 1 < pp, so the
    only group it takes is 3, the one the order is simulated with."""
    text = await _export(tmp_path, 3)
    flags = shlex.split(read_export(text)["MEGATRON_ARGS"])
    assert flags[flags.index(GROUP_FLAG) + 1] == "3"
    assert "Megatron refuses this interleaved order" not in text


async def test_the_export_says_megatron_refuses_fewer_microbatches_than_ranks(
        tmp_path: Path) -> None:
    """m < pp: no group lies in [pp, m], so Megatron raises whatever the flags say; the
    export says so under its flags, as `ppsim split` warns."""
    text = await _export(tmp_path, 1)
    notes = [line for line in text.splitlines() if "Megatron refuses" in line]
    assert len(notes) == 1 and notes[0].startswith("# ")
    assert "outside [pp=2, m=1]" in notes[0]
