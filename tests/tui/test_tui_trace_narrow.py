"""A trace at 80x24: its error (and a mismatch) readable on the screen itself.

Before: the compare panel's first line ended `(of 12, as ppsim…` and the status line
`trace …/real.json loaded: error -6.…`, both cutting the one figure that matters,
the ops line lost its `only real` count, and a mismatched trace's status line began
with its path.
"""

from __future__ import annotations

from ppsim.tui.app import PPSimApp
from ppsim.tui.testing import screen_text, settle

MATCHED = "traces/interleaved-3-1-2-2-m8"
OTHER = "traces/1f1b-5-3-m8"


def rows_with(app: PPSimApp, text: str) -> list[str]:
    return [line for line in screen_text(app) if text in line]


async def test_the_error_is_on_the_screen_at_80x24() -> None:
    app = PPSimApp(config_path=f"{MATCHED}/config.toml", trace_path=f"{MATCHED}/real.json")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        cmp = app.comparison
        assert cmp is not None and not cmp.hidden
        error = f"error {cmp.rel_error:+.1%}"
        assert rows_with(app, f"│ {error}: real iteration {cmp.iteration}")  # the panel
        assert rows_with(app, f" trace loaded: {error} (as ppsim diff)")  # the status line
        ops = rows_with(app, "ops matched")
        assert ops and f"real only {cmp.real_only} " in ops[0] and "…" not in ops[0]


async def test_the_mismatch_is_on_the_status_line_at_80x24() -> None:
    app = PPSimApp(config_path=f"{MATCHED}/config.toml", trace_path=f"{OTHER}/real.json")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.comparison is not None and app.comparison.hidden
        status = [x for x in screen_text(app) if x.startswith(" trace differs: ")]
        assert status and "schedule 1f1b (simulated interleaved-1f1b)" in status[0]
