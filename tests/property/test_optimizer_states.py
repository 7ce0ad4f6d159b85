"""Adam's state as the distributed optimizer keeps it: smaller dtypes, more shards or
fewer experts never cost a rank more static memory."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.arch import Architecture
from ppsim.costs.state import OPTIMIZER_DTYPES, STATE_BYTES, bytes_per_param

MOMENTS = ("exp_avg_dtype", "exp_avg_sq_dtype")


def _arch(**kw) -> Architecture:
    return Architecture(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4,
                        ffn_hidden_size=256, vocab_size=512, seq_length=64,
                        distributed_optimizer=True, **kw)


@settings(max_examples=80, deadline=None)
@given(st.fixed_dictionaries({k: st.sampled_from(v) for k, v in OPTIMIZER_DTYPES.items()}),
       st.sampled_from(MOMENTS), st.integers(1, 64), st.integers(1, 8), st.integers(1, 8),
       st.booleans())
def test_a_smaller_moment_dtype_or_more_shards_never_costs_more(dtypes, moment, dp, cp, ep,
                                                               experts) -> None:
    a = _arch(precision_aware_optimizer=True, dp=dp, cp=cp, ep=ep, **dtypes)
    smaller = min(STATE_BYTES, key=STATE_BYTES.get)
    assert bytes_per_param(replace(a, **{moment: smaller}), experts) <= \
        bytes_per_param(a, experts)
    assert bytes_per_param(replace(a, dp=dp * 2), experts) <= bytes_per_param(a, experts)
    # Experts shard over dp x cp / ep ranks, never more than dense parameters do.
    assert bytes_per_param(a, experts=True) >= bytes_per_param(a)
    # The precision-aware optimizer with fp32 states keeps less than Megatron's default
    # (its master weight is the 16-bit remainder, not a whole fp32 copy).
    plain = _arch(dp=dp, cp=cp, ep=ep)
    fp32 = _arch(precision_aware_optimizer=True, dp=dp, cp=cp, ep=ep)
    assert bytes_per_param(fp32, experts) < bytes_per_param(plain, experts)
