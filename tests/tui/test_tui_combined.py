"""The TUI under Megatron's combined 1F1B: a setting Megatron refuses with the flag
(another schedule, one chunk per rank with pp > 1) reverts and says Megatron's reason."""

from __future__ import annotations

from pathlib import Path

from test_tui_throughput import MIXTRAL_A2A

from ppsim.config.schema import load_config
from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import SIZE, settle


async def test_a_schedule_without_a_combined_order_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a2a.toml"
    path.write_text(MIXTRAL_A2A)
    app = PPSimApp(load_config(str(path)), config_path=str(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        good = app.state
        assert good.schedule == "interleaved-1f1b" and app.result.sim.problem.schedule.pairs
        app.query_one("#set-schedule").value = "zbv"
        await settle(pilot)
        assert app.state == good
        assert "no combined 1F1B" in app.query_one("#status").text
        inp = app.query_one("#set-vpp")
        inp.focus()
        inp.value = "1"
        await pilot.press("enter")
        await settle(pilot)
        assert app.state == good
        assert "virtual_pipeline_model_parallel_size must be specified" in \
            app.query_one("#status").text
