"""Sequence parallelism's invariants on random dense and hybrid models: at tp 1 it changes
nothing (Megatron turns it off there); at tp > 1 each saved tensor between the
tensor-parallel blocks is whole on every tensor rank without it and 1 / tp with it, every
other tensor 1 / tp either way, so a layer never keeps less without it; the pipeline's
message is tp times larger; and a layer's tensor-parallel traffic moves the same bytes
(an all-reduce is a reduce-scatter and an all-gather) within the links' latencies."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.saved import saved_tensors
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.traffic import tp_layer_ms
from ppsim.pipeline.problem import build_problem

PRESETS = st.sampled_from(["tiny-gpt", "tiny-llm", "gpt3-1.3b", "llama3-8b", "nemotron-h-8b"])
BETWEEN = ("norm1.", "norm2.", "drop1.", "drop2.")
"""A dense GQA layer's tensors between its tensor-parallel blocks (Korthikanti's 10 sbh):
both norms' inputs, statistics and outputs, both dropout masks."""


def config(preset: str, tp: int, sp: bool, **over):
    return config_from_dict({"model": {"preset": preset, "tp": tp, "sequence_parallel": sp,
                                       **over}, "hardware": {"preset": "h100-80gb"}})


@settings(max_examples=25, deadline=None)
@given(PRESETS, st.sampled_from(["none", "selective", "full"]), st.booleans())
def test_at_tp_1_nothing_changes(preset: str, recompute: str, dropout: bool) -> None:
    on, off = (config(preset, 1, sp, recompute=recompute, dropout=dropout) for sp in (True, False))
    acc = accelerator(on.hardware)
    assert transformer_costs(on.model.arch, acc) == transformer_costs(off.model.arch, acc)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["tiny-gpt", "gpt3-1.3b", "llama3-8b"]), st.sampled_from([2, 4]),
       st.booleans())
def test_each_tensor_is_split_by_its_own_rule(preset: str, tp: int, dropout: bool) -> None:
    one = saved_tensors(config(preset, 1, True, dropout=dropout).model.arch, "dense")
    for sp in (True, False):
        got = saved_tensors(config(preset, tp, sp, dropout=dropout).model.arch, "dense")
        assert set(got) == set(one)
        for name, whole in one.items():
            between = name.startswith(BETWEEN)
            want = whole if between and not sp else whole / tp
            assert got[name] == pytest.approx(want), name


@settings(max_examples=20, deadline=None)
@given(PRESETS, st.sampled_from([2, 4]), st.sampled_from(["none", "selective", "full"]))
def test_without_it_a_layer_keeps_more_and_sends_tp_times_more(preset: str, tp: int,
                                                                recompute: str) -> None:
    on, off = (config(preset, tp, sp, recompute=recompute) for sp in (True, False))
    acc = accelerator(on.hardware)
    split, whole = (transformer_costs(c.model.arch, acc) for c in (on, off))
    for a, b in zip(split.layers, whole.layers, strict=True):
        assert b.activation_bytes >= a.activation_bytes
        assert b.output_bytes == tp * a.output_bytes
    assert whole.head.activation_bytes >= split.head.activation_bytes


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["gpt3-1.3b", "llama3-8b"]), st.sampled_from([2, 4, 8]),
       st.sampled_from([1, 2]))
def test_the_same_bytes_move_either_way(preset: str, tp: int, sublayers: int) -> None:
    on = config(preset, tp, True)
    job = build_problem(on).hardware.job
    a = on.model.arch
    link = job.link("tp")
    (f_on, b_on), (f_off, b_off) = (tp_layer_ms(job, replace(a, sequence_parallel=sp),
                                                sublayers) for sp in (True, False))
    # a ring all-reduce is a reduce-scatter and an all-gather: the same time; NCCL's tree
    # may only be cheaper
    assert f_off.total_ms <= f_on.total_ms * (1 + 1e-9)
    assert b_off.total_ms <= b_on.total_ms * (1 + 1e-9)
    # and never cheaper than the bytes' time on the links
    wire = 2 * (tp - 1) / tp * a.seq_length * a.micro_batch_size * a.hidden_size * 2 \
        / (link.bus_bandwidth_gbps * 1e6)
    assert f_off.total_ms >= sublayers * wire * (1 - 1e-9)
