"""The session's pooled launches (see launches.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from launches import Launch, Pool

_DONE: list[Launch] = []


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    pytest.importorskip("torch")
    pool = Pool(tmp_path_factory.mktemp)
    yield pool
    _DONE.extend(pool.done.values())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many pooled launches ran and how long each took (the suite's main cost)."""
    if not _DONE:
        return
    runs = sorted(_DONE, key=lambda r: -r.elapsed_s)
    terminalreporter.write_line(
        f"pooled ppsim run launches: {len(runs)}, "
        f"{sum(r.elapsed_s for r in runs):.0f} s in all; slowest: "
        + ", ".join(f"{r.name} {r.elapsed_s:.0f} s" for r in runs[:5]))
