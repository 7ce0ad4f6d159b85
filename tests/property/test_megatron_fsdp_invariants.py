"""Megatron-FSDP's invariants on random jobs: its buffers are two units' gathered weights
and one unit's gradient on every GPU, whatever the stage, and take that much off the
memory the model may use; more shards never cost a rank more memory; each gradient lands
in the training dtype, so a backward is never slower than the distributed optimizer's
fp32 landing, and the forward is the same; each layer's collectives run every
microbatch, pipeline or not."""

from __future__ import annotations

from fsdp_forms import tiny_cfg as cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.arch import DTYPE_BYTES
from ppsim.costs.transformer import accelerator, held_params, transformer_costs
from ppsim.job.layers import layer_collectives
from ppsim.pipeline.problem import build_problem, model_costs

PRESETS = st.sampled_from(["tiny-llm", "tiny-gpt"])
MFSDP = {"fsdp": True, "fsdp_framework": "megatron-fsdp"}


@settings(max_examples=30, deadline=None)
@given(PRESETS, st.integers(2, 64), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
       st.sampled_from([1, 2]))
def test_its_buffers_are_two_units_and_a_gradient(preset: str, dp: int, tp: int, cp: int,
                                                  pp: int) -> None:
    c = cfg(preset, {"dp": dp, "tp": tp, "cp": cp, **MFSDP}, pp)
    problem = build_problem(c)
    a = c.model.arch
    unit = held_params(a, "dense")  # these presets' one kind of layer
    w = DTYPE_BYTES[a.dtype]  # weights gathered and gradients kept in the model's dtype
    assert problem.hardware.job.fsdp_buffer_bytes == int((unit.dense + unit.experts) * 3 * w)
    assert problem.hardware.memory_bytes == c.hardware.memory_bytes \
        - problem.hardware.job.fsdp_buffer_bytes


@settings(max_examples=30, deadline=None)
@given(PRESETS, st.integers(1, 63), st.sampled_from([1, 2]), st.sampled_from([1, 2]))
def test_more_shards_never_cost_more(preset: str, dp: int, cp: int, pp: int) -> None:
    def static(n: int) -> int:
        got = model_costs(cfg(preset, {"dp": n, "cp": cp, **MFSDP}, pp))
        return sum(x.static_bytes for x in (*got.layers, got.embedding, got.head))

    assert static(dp + 1) <= static(dp) or dp * cp == 1  # one rank gathers nothing


@settings(max_examples=30, deadline=None)
@given(PRESETS, st.integers(1, 16), st.sampled_from([1, 2]))
def test_its_gradients_land_no_slower(preset: str, dp: int, tp: int) -> None:
    c = cfg(preset, {"dp": dp, "tp": tp, **MFSDP})
    d = cfg(preset, {"dp": dp, "tp": tp, "distributed_optimizer": True})
    acc = accelerator(c.hardware)
    own, ddp = transformer_costs(c.model.arch, acc), transformer_costs(d.model.arch, acc)
    for x, y in zip((*own.layers, own.head), (*ddp.layers, ddp.head), strict=True):
        assert x.weight_grad_ms <= y.weight_grad_ms
        assert x.forward_ms == y.forward_ms


@settings(max_examples=30, deadline=None)
@given(PRESETS, st.integers(2, 32), st.sampled_from([1, 2, 4]))
def test_each_layer_gathers_and_reduces_every_microbatch(preset: str, dp: int,
                                                         pp: int) -> None:
    c = cfg(preset, {"dp": dp, **MFSDP}, pp)
    job = build_problem(c).hardware.job
    a = c.model.arch
    layer = transformer_costs(a, accelerator(c.hardware)).layers[0]
    got = layer_collectives(job, a, accelerator(c.hardware), "dense", layer)
    f = sum(x.total_ms for x in got.forward if x.group == "dp")
    b = sum(x.total_ms for x in got.backward if x.group == "dp")
    assert f > 0 and b > f  # a gather each way, and the reduce-scatter too


@settings(max_examples=20, deadline=None)
@given(PRESETS, st.integers(2, 32), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
       st.sampled_from(["tensorwise", "delayed", "blockwise"]))
def test_fp8_weights_never_hold_or_gather_more(preset: str, dp: int, tp: int, pp: int,
                                               recipe: str) -> None:
    """Under --fp8-param-gather a layer's shard, its buffers and its gathers are never
    more than bf16 weights' (a byte a matrix weight for two); TE's cached FP8 copies of
    bf16 weights always are."""
    base = {"dp": dp, "tp": tp, "dtype": "bf16", **MFSDP}
    fp8 = {"fp8": "hybrid", "fp8_recipe": recipe}
    plain = build_problem(cfg(preset, base, pp))
    ours = build_problem(cfg(preset, {**base, **fp8, "fp8_param_gather": True}, pp))
    cached = build_problem(cfg(preset, {**base, **fp8}, pp))
    for mine, bf16, te in zip(ours.stage_costs, plain.stage_costs, cached.stage_costs,
                              strict=True):
        assert mine.static_bytes < bf16.static_bytes < te.static_bytes
    assert ours.hardware.job.fsdp_buffer_bytes < plain.hardware.job.fsdp_buffer_bytes
