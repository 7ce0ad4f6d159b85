"""A trace given at start (`--trace`) says how it compares on the status line, as one
loaded with `t` does, once the first simulation is there to compare with."""

from __future__ import annotations

import pytest

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import settle, status_text

MATCHED = "traces/1f1b-5-3-m8"
OTHER = "traces/interleaved-3-1-2-2-m8"


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_a_trace_of_another_shape_given_at_start_says_so(size: tuple[int, int]) -> None:
    app = PPSimApp(config_path=f"{OTHER}/config.toml", trace_path=f"{MATCHED}/real.json")
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        assert app.comparison is not None and app.comparison.hidden
        assert "figures are hidden" in status_text(app)
        assert "vpp 1 (simulated 2)" in status_text(app)


async def test_a_matching_trace_given_at_start_says_its_error() -> None:
    app = PPSimApp(config_path=f"{MATCHED}/config.toml", trace_path=f"{MATCHED}/real.json")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.comparison is not None and not app.comparison.hidden
        assert f"{app.comparison.rel_error:+.1%}" in status_text(app)
        assert "loaded: error" in status_text(app)
