"""A sliding window never makes a layer's attention more work, and a wider one never
less."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import attention_ops, window_share


def _core(a: Architecture, window: int) -> float:
    return next(op.flops for op in attention_ops(a, window) if op.attention)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 20000), st.integers(1, 30000), st.integers(1, 30000))
@example(100, 98, 99)  # a window one key short of the sequence
def test_wider_windows_keep_more_and_never_more_than_causal(s: int, w1: int, w2: int) -> None:
    lo, hi = sorted((w1, w2))
    assert 0 < window_share(s, lo) <= window_share(s, hi) <= 1.0
    a = Architecture(num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=4,
                     ffn_hidden_size=128, vocab_size=100, seq_length=s)
    assert _core(a, lo) <= _core(a, hi) <= _core(a, 0)
