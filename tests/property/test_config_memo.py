"""The config's parse and hardware check run once per distinct value (ppsim.config.memo):
a cached answer is the uncached one, values that hash alike but differ in type (1, 1.0,
True) stay apart, and a refusal is said again every time."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.config.memo import frozen_items, value_key
from ppsim.config.model import one_sharding, parse_model
from ppsim.config.schema import hardware_config
from ppsim.config.validate_hardware import hardware
from ppsim.errors import UserError

BASE = parse_model({"preset": "llama3-8b"})
SCALARS = st.one_of(st.integers(-2, 64), st.booleans(), st.floats(allow_nan=False, width=16),
                    st.sampled_from(["full", "selective", "none", "p2p", "x"]))
CHANGES = st.dictionaries(st.sampled_from(["tp", "cp", "dp", "micro_batch_size", "recompute",
                                           "sequence_parallel", "distributed_optimizer",
                                           "cp_comm_type", "seq_length"]), SCALARS, max_size=4)


def _uncached(changes: dict) -> object:
    try:
        return parse_model({**BASE.to_dict(), **one_sharding(changes)})
    except UserError as e:
        return ("refused", e.field, str(e))


def _cached(changes: dict) -> object:
    try:
        return BASE.with_fields(changes)
    except UserError as e:
        return ("refused", e.field, str(e))


@given(CHANGES)
def test_with_fields_cached_is_with_fields_parsed(changes: dict) -> None:
    assert _cached(changes) == _uncached(changes)
    assert _cached(changes) == _uncached(changes)  # again: now from the cache


@pytest.mark.parametrize("value", [1, 1.0, True])
def test_values_that_hash_alike_are_parsed_apart(value: object) -> None:
    """1, 1.0 and True are one dict key; the parse takes an int tp and refuses the rest."""
    for first in (1, 1.0, True):  # whichever was parsed before
        _cached({"tp": first})
        assert _cached({"tp": value}) == _uncached({"tp": value})
    assert len({frozen_items({"tp": v}) for v in (1, 1.0, True)}) == 3


def test_a_list_is_no_cache_key_but_still_parsed() -> None:
    assert frozen_items({"layers": ["dense"]}) is None
    assert value_key(hardware_config({"matmul_efficiency": [[1e9, 0.5]],
                                      "preset": "h100-80gb"})) is not None


@given(st.sampled_from(["memory_bytes", "peak_tflops", "efficiency", "p2p_latency_ms"]),
       st.sampled_from([-1.0, 0.0, float("inf"), float("nan"), 1e30]))
def test_a_refused_hardware_value_is_refused_every_time(name: str, bad: float) -> None:
    good = hardware_config({"preset": "h100-80gb"})
    hardware(good)
    hw = replace(good, **{name: bad})
    try:
        hardware(hw)
    except UserError as first:
        with pytest.raises(UserError) as again:
            hardware(replace(good, **{name: bad}))
        assert str(again.value) == str(first)
    hardware(good)  # the good values still pass
