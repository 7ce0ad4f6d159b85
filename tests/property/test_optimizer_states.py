"""Adam's state as the distributed optimizer keeps it: smaller dtypes, more shards, fewer
experts or more of it on the host never cost a rank more static memory; the host's step
overlapped is never slower."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.arch import Architecture
from ppsim.costs.state import OPTIMIZER_DTYPES, STATE_BYTES, bytes_per_param
from ppsim.job.host_optimizer import HostOptimizer

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


@settings(max_examples=80, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.integers(1, 64), st.integers(1, 8),
       st.booleans())
def test_more_on_the_host_never_leaves_more_on_the_device(f, g, dp, ep, experts) -> None:
    """The host optimizer's share comes off the device's state, whatever the dtypes the
    precision-aware optimizer names (the host optimizer keeps fp32 on both sides)."""
    lo, hi = sorted((f, g))
    a = _arch(precision_aware_optimizer=True, optimizer_cpu_offload=True, dp=dp, ep=ep,
              exp_avg_dtype="bf16")
    assert bytes_per_param(replace(a, optimizer_offload_fraction=hi), experts) <= \
        bytes_per_param(replace(a, optimizer_offload_fraction=lo), experts)
    # Nothing on the host is Megatron's default optimizer, not the precision-aware one.
    assert bytes_per_param(replace(a, optimizer_offload_fraction=0.0), experts) == \
        bytes_per_param(_arch(dp=dp, ep=ep), experts)


@settings(max_examples=150, deadline=None)
@given(st.floats(0, 1e3), st.floats(0, 1e10), st.floats(0, 1e10),
       st.floats(1.0, 1e3), st.floats(1e3, 1e7))
def test_the_host_step_overlapped_is_never_slower(device_ms, lo, hi, link, rate) -> None:
    lo, hi = sorted((lo, hi))
    kw = dict(fraction=1.0, link_gbps=link, threads=1, core_params_per_ms=rate,
              memory_params_per_ms=rate, host_limit_bytes=1e30)
    serial, overlapped = HostOptimizer(overlap=False, **kw), HostOptimizer(overlap=True, **kw)
    for opt in (serial, overlapped):
        assert opt.step_ms(device_ms, lo) >= device_ms  # the device's share still runs
        assert opt.step_ms(device_ms, hi) >= opt.step_ms(device_ms, lo)
    assert overlapped.step_ms(device_ms, hi) <= serial.step_ms(device_ms, hi)
