"""`ppsim profile`'s P2P fit, t = latency + bytes / bandwidth: exact on exact timings, not
bent by one size a busy machine slowed, and never 0 GB/s (which the simulator reads as
free transfers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from ppsim.executor.profile import fit_latency_bandwidth, p2p_sizes  # noqa: E402

LATENCY = st.floats(0.0, 5.0)
BANDWIDTH = st.floats(0.05, 200.0)
HIDDEN = st.integers(8, 1 << 24)


def _samples(latency: float, gbps: float, hidden: int) -> list[dict[str, float]]:
    return [{"bytes": n, "one_way_ms": latency + n / (gbps * 1e6)} for n in p2p_sizes(hidden)]


@settings(max_examples=200, deadline=None)
@given(LATENCY, BANDWIDTH, HIDDEN)
def test_exact_timings_give_back_latency_and_bandwidth(latency: float, gbps: float,
                                                       hidden: int) -> None:
    lat, bw = fit_latency_bandwidth(_samples(latency, gbps, hidden))
    assert bw == pytest.approx(gbps, rel=1e-6)
    assert lat == pytest.approx(latency, rel=1e-6, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(LATENCY, BANDWIDTH, HIDDEN, st.integers(0, 3), st.floats(1.5, 100.0))
def test_one_slowed_size_does_not_bend_the_fit(latency: float, gbps: float, hidden: int,
                                               which: int, factor: float) -> None:
    samples = _samples(latency, gbps, hidden)
    if len(samples) < 5:  # the hidden size coincides with a fixed one: 4 sizes
        return
    samples[which]["one_way_ms"] *= factor
    lat, bw = fit_latency_bandwidth(samples)
    assert bw == pytest.approx(gbps, rel=1e-6)
    assert lat == pytest.approx(latency, rel=1e-6, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1 << 24), st.floats(1e-4, 100.0)), min_size=1,
                max_size=8))
def test_any_positive_timings_give_a_positive_bandwidth(points) -> None:
    lat, bw = fit_latency_bandwidth([{"bytes": b, "one_way_ms": t} for b, t in points])
    assert bw > 0 and lat >= 0
