"""How many message and latency samples a profile of N repeats takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")

from ppsim.costs.costfile import PROFILE_REPEATS  # noqa: E402
from ppsim.executor.conditions import _samples  # noqa: E402


@given(st.integers(1, 10_000), st.integers(1, 10_000), st.integers(1, 200),
       st.integers(1, 200))
def test_samples_grow_with_repeats_within_their_bounds(full: int, least: int, a: int,
                                                       b: int) -> None:
    least = min(least, full)
    lo, hi = sorted((a, b))
    n_lo, n_hi = _samples(full, least, lo), _samples(full, least, hi)
    assert least <= n_lo <= n_hi <= full
    # The default repeats (and more) take every sample a profile always took.
    assert _samples(full, least, max(hi, PROFILE_REPEATS)) == full
