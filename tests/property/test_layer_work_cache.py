"""A layer's work is priced once for every data-parallel size (ppsim.costs.transformer:
_kind_work keyed by _state_free): outside FSDP, dp reaches a layer only through its
optimizer shards, so pricing the work at one data-parallel rank changes nothing, and a
model priced after another of a different dp (its work cached) costs what it costs
priced alone."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs import transformer
from ppsim.costs.fp8 import fp8_layers, layer_precision
from ppsim.costs.stack import layer_kinds, layer_windows
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.errors import UserError

PRESETS = ("llama3-8b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b", "nemotron-h-8b",
           "qwen3-next-80b-a3b")
SHARDING = ({}, {"distributed_optimizer": True}, {"distributed_optimizer": True,
                                                   "dp_replicas": 2},
            {"fsdp": True, "fsdp_framework": "megatron-fsdp"})


def _arch(preset: str, tp: int, dp: int, sharding: dict, extra: dict):
    try:
        c = config_from_dict({"model": {"preset": preset, "tp": tp, "dp": dp, "ep": 1,
                                        **sharding, **extra},
                              "hardware": {"preset": "h100-80gb"}})
    except UserError:  # a combination Megatron refuses (--fp8-param-gather unsharded)
        assume(False)
    return c.model.arch, accelerator(c.hardware)


EXTRAS = st.sampled_from([{}, {"optimizer": "muon"}, {"recompute": "full"},
                          {"fp8": "hybrid", "fp8_recipe": "tensorwise"},
                          {"fp8": "hybrid", "fp8_recipe": "tensorwise",
                           "fp8_param_gather": True}])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(PRESETS), st.sampled_from([1, 2, 4]), st.sampled_from([2, 8, 64]),
       st.sampled_from(SHARDING), EXTRAS)
def test_one_data_parallel_rank_prices_the_same_work(preset: str, tp: int, dp: int,
                                                     sharding: dict, extra: dict) -> None:
    a, acc = _arch(preset, tp, dp, sharding, extra)
    free = transformer._state_free(a)
    if a.fsdp:  # Megatron-FSDP's FP8 weight shards read dp
        assert free is a
        return
    assert (free.dp, free.dp_replicas) == (1, 1)
    work = transformer._kind_work.__wrapped__  # uncached
    for kind, window, fp8 in set(zip(layer_kinds(a), layer_windows(a), fp8_layers(a),
                                     strict=True)):
        p = layer_precision(a, fp8)
        assert work(p, acc, kind, None, None, window) == \
            work(transformer._state_free(p), acc, kind, None, None, window)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(PRESETS), st.sampled_from([1, 2, 4]), st.sampled_from([2, 8, 64]),
       st.sampled_from(SHARDING), EXTRAS)
def test_a_model_costs_the_same_after_another_data_parallel_size(
        preset: str, tp: int, dp: int, sharding: dict, extra: dict) -> None:
    a, acc = _arch(preset, tp, dp, sharding, extra)
    transformer._kind_work.cache_clear()
    alone = transformer_costs(a, acc)
    other = transformer_costs(replace(a, dp=dp * 2), acc)  # its work now cached
    after = transformer_costs(a, acc)
    assert after == alone
    # dp reaches the state alone: a layer's times and activations do not move
    for mine, theirs in zip(alone.layers, other.layers, strict=True):
        assert replace(mine, static_bytes=0) == replace(theirs, static_bytes=0)
    if a.distributed_optimizer or a.fsdp:  # the state shards over twice the ranks
        assert sum(c.static_bytes for c in other.layers) < \
            sum(c.static_bytes for c in alone.layers)
