"""The session's pooled launches (see launches.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from launches import Pool


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    pytest.importorskip("torch")
    pool = Pool(tmp_path_factory.mktemp, int(os.environ.get("PPSIM_TEST_LAUNCHES", "1")))
    yield pool
    pool.close()
