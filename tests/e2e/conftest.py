"""The session's pooled launches (see launches.py), all on one pytest-xdist worker
(tests/conftest.py's scheduler), which reports them to the controller at its end."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from launches import Pool

_DONE: list[tuple[str, float]] = []
"""(name, seconds) of each launch, on the process that prints the summary."""
_POOL: list[Pool] = []


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    pytest.importorskip("torch")
    pool = Pool(tmp_path_factory.mktemp)
    _POOL.append(pool)
    yield pool


def _runs() -> list[tuple[str, float]]:
    return [(r.name, r.elapsed_s) for pool in _POOL for r in pool.done.values()]


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = getattr(session.config, "workeroutput", None)
    if out is not None:  # an xdist worker: the controller prints the summary
        out["ppsim_launches"] = json.dumps(_runs())
    else:
        _DONE.extend(_runs())


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown under -p no:xdist
def pytest_testnodedown(node: object, error: object) -> None:
    _DONE.extend((n, s) for n, s in json.loads(
        getattr(node, "workeroutput", {}).get("ppsim_launches", "[]")))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many pooled launches ran and how long each took (the suite's main cost)."""
    if not _DONE:
        return
    runs = sorted(_DONE, key=lambda r: -r[1])
    terminalreporter.write_line(
        f"pooled ppsim run launches: {len(runs)}, "
        f"{sum(s for _, s in runs):.0f} s in all; slowest: "
        + ", ".join(f"{n} {s:.0f} s" for n, s in runs[:5]))
