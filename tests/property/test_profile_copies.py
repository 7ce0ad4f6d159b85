"""How many copies of a measuring group `ppsim profile` runs at once
(ppsim.executor.profile_tp.profile_copies): one per pipeline rank of the run, within the
run's own limit of processes a core, never none."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")

from ppsim.executor.profile_tp import PROCESSES_PER_CORE, profile_copies  # noqa: E402


@given(group=st.integers(1, 64), ranks=st.integers(1, 256), cores=st.integers(1, 256))
def test_copies_fill_the_host_as_the_run_would(group: int, ranks: int, cores: int) -> None:
    n = profile_copies(group, ranks, cores)
    assert 1 <= n <= ranks
    assert n == 1 or n * group <= PROCESSES_PER_CORE * cores
    # as many as fit: one more would pass the run's limit, or the run's pipeline ranks
    assert n == ranks or (n + 1) * group > PROCESSES_PER_CORE * cores


def test_the_tests_host_times_both_pipeline_ranks() -> None:
    """tp 2 at pp 2 on 2 cores: both ranks' groups at once (4 processes, as the run)."""
    assert profile_copies(2, 2, 2) == 2
    assert profile_copies(16, 64, 2) == 1  # 16 processes fill 2 cores alone
