"""Tests for ppsim.pipeline.exports: a split as Megatron flags, torchtitan's module names
and DeepSpeed's boundaries, each read back the way its framework reads it; and every
rejection of a split naming its field.
"""

from __future__ import annotations

import argparse

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from megatron_split_ref import FAST, accepted, call, megatron_configs, splits

from ppsim.cli.flags import add_config_flags, config_from_args
from ppsim.errors import UserError
from ppsim.pipeline.exports import (
    deepspeed_boundaries,
    megatron_flags,
    megatron_layout_flag,
    torchtitan_fqns,
)
from ppsim.pipeline.layout import parse_layout
from ppsim.pipeline.problem import resolve_split
from ppsim.pipeline.split import Split, even_split, megatron_split, split_from_counts

# --- Exports ---------------------------------------------------------------------------------


MEGATRON_FLAGS = {
    "--num-layers", "--pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--pipeline-model-parallel-layout", "--mtp-num-layers",
}


def rebuild(argv):
    """Read back megatron_flags' argv the way Megatron would."""
    values, flags, i = {}, set(), 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values[argv[i]] = argv[i + 1]
            i += 2
        else:
            flags.add(argv[i])
            i += 1
    L, pp = int(values["--num-layers"]), int(values["--pipeline-model-parallel-size"])
    if "--pipeline-model-parallel-layout" in values:
        assert "--num-virtual-stages-per-pipeline-rank" not in values  # Megatron refuses both
        return parse_layout(values["--pipeline-model-parallel-layout"], pp, L)
    # Every flag is one Megatron-LM's argument parser defines (megatron/training/arguments.py);
    # --overlap-p2p-comm is not among them and fails with "unrecognized arguments".
    assert set(values) | flags <= MEGATRON_FLAGS, (set(values) | flags) - MEGATRON_FLAGS
    vpp = int(values.get("--num-virtual-stages-per-pipeline-rank", 1))
    first = values.get("--decoder-first-pipeline-num-layers")
    last = values.get("--decoder-last-pipeline-num-layers")
    if pp == 2 and vpp > 1:
        assert first is None or last is None  # Megatron divides by zero on that one
    return megatron_split(
        L,
        pp,
        vpp,
        None if first is None else int(first),
        None if last is None else int(last),
        "--account-for-embedding-in-pipeline-split" in flags,
        "--account-for-loss-in-pipeline-split" in flags,
    )


def test_megatron_flags_pick_the_shortest_form():
    assert megatron_flags(even_split(32, 4)) == [
        "--num-layers", "32", "--pipeline-model-parallel-size", "4"
    ]  # fmt: skip
    assert megatron_flags(even_split(32, 4, 2))[4:] == [
        "--num-virtual-stages-per-pipeline-rank", "2"
    ]  # fmt: skip
    assert megatron_flags(megatron_split(60, 8, 1, 6, 6))[4:] == [
        "--decoder-first-pipeline-num-layers", "6", "--decoder-last-pipeline-num-layers", "6"
    ]  # fmt: skip
    assert megatron_flags(megatron_split(60, 5, 1, None, 4))[4:] == [
        "--decoder-last-pipeline-num-layers", "4"
    ]  # fmt: skip
    assert megatron_flags(call(62, 4, 1, emb=True, loss=True))[4:] == [
        "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"
    ]  # fmt: skip
    assert megatron_flags(Split((3, 1, 4), 3))[4:] == [
        "--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "4"
    ]  # fmt: skip
    assert megatron_flags(Split((3, 1, 2, 4), 4))[4:] == [
        "--pipeline-model-parallel-layout", "Et*3|t|t*2|t*4L"
    ]  # fmt: skip
    # pp = 2 with virtual stages and both ends uneven: first alone says it, and avoids the
    # first + last form that Megatron crashes on; no --overlap-p2p-comm (not a Megatron flag).
    assert megatron_flags(Split((2, 4, 2, 4), 2, 2))[4:] == [
        "--num-virtual-stages-per-pipeline-rank", "2",
        "--decoder-first-pipeline-num-layers", "4",
    ]  # fmt: skip


@FAST
@given(splits | megatron_configs().map(lambda c: call(*c) if accepted(c) else None))
def test_megatron_flags_rebuild_the_same_split(split):
    assume(split is not None and not (split.pp == 1 and split.vpp > 1))
    assert rebuild(megatron_flags(split)) == split
    assert rebuild(megatron_layout_flag(split)) == split


@FAST
@given(splits)
def test_ppsim_reads_back_the_megatron_flags_it_exports(split):
    # `ppsim split` printed --num-virtual-stages-per-pipeline-rank, which ppsim refused.
    assume(split.num_layers > 0 and not (split.pp == 1 and split.vpp > 1))
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    for argv in (megatron_flags(split), megatron_layout_flag(split)):
        args = parser.parse_args([*argv, "--microbatches", str(2 * split.pp)])
        assert resolve_split(config_from_args(args)) == split, argv


@FAST
@given(splits)
def test_torchtitan_fqns(split):
    # a middle stage with no layer holds no module: torchtitan's optimizer refuses the part
    if any(n == 0 for n in split.counts[1:-1]):
        with pytest.raises(UserError, match="holds no module"):
            torchtitan_fqns(split)
        return
    parts = torchtitan_fqns(split)
    assert len(parts) == split.num_stages
    assert parts[0][:1] == ["tok_embeddings"] and parts[-1][-2:] == ["norm", "lm_head"]
    layers = [name for part in parts for name in part if name.startswith("layers.")]
    assert layers == [f"layers.{k}" for k in range(split.num_layers)]
    assert [sum(n.startswith("layers.") for n in p) for p in parts] == list(split.counts)


TORCHTITAN_TOP_MODULES = ("tok_embeddings", "layers", "norm", "lm_head")
"""torchtitan's Llama/DeepSeek Transformer at HEAD, in forward order (the head was `output`
before PR #2937, 2026-04-27)."""


def torchtitan_split_rule(part: list[str], num_layers: int) -> list[str]:
    """torchtitan's pipeline_module_split (torchtitan/distributed/pipeline_parallel.py), as
    documented: a model part keeps the modules its fqn list names; every other top-level
    module is set to None and every unlisted layer is deleted. Returns the forward order
    of the modules that stay."""
    kept = []
    for name in TORCHTITAN_TOP_MODULES:
        if name == "layers":
            kept += [f"layers.{k}" for k in range(num_layers) if f"layers.{k}" in part]
        elif name in part:
            kept.append(name)
    return kept


@FAST
@given(splits)
def test_torchtitan_split_keeps_the_head_on_the_last_stage(split):
    assume(all(split.counts[1:-1]))
    parts = [torchtitan_split_rule(p, split.num_layers) for p in torchtitan_fqns(split)]
    assert parts[-1][-1] == "lm_head", "the last stage would return hidden states"
    assert parts[0][0] == "tok_embeddings"
    assert sum(len(p) for p in parts) == split.num_layers + 3  # nothing lost or doubled


def test_torchtitan_fqns_example():
    assert torchtitan_fqns(Split((1, 2), 2)) == [
        ["tok_embeddings", "layers.0"], ["layers.1", "layers.2", "norm", "lm_head"]
    ]  # fmt: skip


@FAST
@given(
    st.integers(1, 8).flatmap(
        lambda pp: st.lists(st.integers(1, 9), min_size=pp, max_size=pp).map(
            lambda c: Split(tuple(c), pp)
        )
    )
)
def test_deepspeed_boundaries(split):
    bounds = deepspeed_boundaries(split)
    assert bounds[0] == 0 and bounds[-1] == split.num_layers + 2
    assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    extra = [0] * split.pp
    extra[0] += 1  # embedding
    extra[-1] += 1  # head
    assert sizes == [n + e for n, e in zip(split.counts, extra, strict=True)]


def test_deepspeed_boundaries_example_and_limits():
    assert deepspeed_boundaries(Split((3, 4, 5), 3)) == [0, 4, 8, 14]
    assert deepspeed_boundaries(Split((0, 2, 0), 3)) == [0, 1, 3, 4]
    assert deepspeed_boundaries(Split((7,), 1)) == [0, 9]


# --- Every rejection names its field -----------------------------------------------------------


@pytest.mark.parametrize(
    "make, field, message",
    [
        (lambda: Split((1, 2), 0), "pipeline.pp", "pp is 0"),
        (lambda: Split((1, 2), 2, 0), "pipeline.vpp", "vpp is 0"),
        (lambda: Split((1, 2), True), "pipeline.pp", "not a whole number"),
        (lambda: Split((1, 2, 3, 4), 2, 2, "zigzag"), "pipeline.placement", "zigzag"),
        (lambda: Split((1, 2, 3, 4, 5, 6), 2, 3, "v"), "pipeline.vpp", "exactly 2"),
        (lambda: Split("12", 2), "pipeline.split", "not a list"),
        (lambda: Split(5, 1), "pipeline.split", "not a list"),
        (lambda: split_from_counts([1, 2, 3], 2, 2), "pipeline.split", "needs 4"),
        (lambda: split_from_counts([1, -1], 2), "pipeline.split", "entry 1 is -1"),
        (lambda: split_from_counts([1, 2.5], 2), "pipeline.split", "not a whole number"),
        (lambda: split_from_counts([1, True], 2), "pipeline.split", "not a whole number"),
        (
            lambda: split_from_counts([15, 15], 2, num_layers=32),
            "pipeline.split",
            "sums to 30 but the model has 32 layers \\(make the counts add up to 32\\)",
        ),
        (lambda: Split((1, 2), 2).stage_rank(2), "pipeline.stage", "out of range"),
        (lambda: Split((1, 2), 2).stage_index(0, 1), "pipeline.chunk", "out of range"),
        (lambda: megatron_split(0, 2), "model.num_layers", "num_layers is 0"),
        (lambda: megatron_split(8, 1, 2), "pipeline.vpp", "pp=1"),
        (lambda: megatron_split(8, 2, 1, 0, None), "pipeline.first_stage_layers", "is 0"),
        (lambda: megatron_split(8, 2, 1, None, -2), "pipeline.last_stage_layers", "is -2"),
        (lambda: megatron_split(12, 3, 2, 3), "pipeline.first_stage_layers", "vpp=2"),
        (lambda: megatron_split(12, 3, 2, None, 3), "pipeline.last_stage_layers", "vpp=2"),
        (
            lambda: megatron_split(10, 2, 1, 4, 4),
            "pipeline.first_stage_layers",
            "2 middle layers remaining but 0 middle PP stages available",
        ),
        (
            lambda: megatron_split(8, 4, 1, 4, 4),
            "pipeline.first_stage_layers",
            "0 middle layers remaining but 2 middle PP stages available",
        ),
        (lambda: megatron_split(10, 4, 1, 8, 6), "pipeline.first_stage_layers", "exceed"),
        (lambda: megatron_split(10, 1, 1, 10, 5), "pipeline.last_stage_layers", "all 10 layers"),
        (lambda: megatron_split(10, 1, 1, 4), "pipeline.first_stage_layers", "is 4, but"),
        (lambda: megatron_split(61, 4, 1, 12), "pipeline.first_stage_layers", "49 middle"),
        (lambda: megatron_split(13, 4, 2, None, 4), "pipeline.last_stage_layers", "vpp=2"),
        (
            lambda: megatron_split(8, 2, 1, 4, None, True),
            "pipeline.first_stage_layers",
            "cannot be combined",
        ),
        (
            lambda: megatron_split(32, 4, 1, account_for_embedding=True),
            "pipeline.account_for_embedding",
            "33 do not divide over pp=4",
        ),
        (
            lambda: megatron_split(33, 2, 4, account_for_loss=True, account_for_embedding=False),
            "pipeline.account_for_loss",
            "34 give 17 per rank",
        ),
        (
            lambda: megatron_split(12, 2, 3, account_for_loss=True),
            "pipeline.account_for_loss",
            "do not divide over pp=2",
        ),
        (lambda: even_split(30, 4), "pipeline.pp", "should be divisible"),
        (lambda: even_split(32, 4, 3), "pipeline.vpp", "8 layers per rank"),
        (lambda: parse_layout("EtL", 0), "pipeline.pp", "pp is 0"),
        (lambda: megatron_flags(Split((1, 2, 3, 4), 2, 2, "v")), "pipeline.placement", "loop"),
        (lambda: megatron_flags(Split((1, 2), 1, 2)), "pipeline.vpp", "pp >= 2"),
        (lambda: deepspeed_boundaries(Split((1, 2, 3, 4), 2, 2)), "pipeline.vpp", "vpp=2"),
        (lambda: deepspeed_boundaries(Split((1, 0, 3), 3)), "pipeline.split", "stage 1"),
    ],
)
def test_rejections_name_the_field(make, field, message):
    with pytest.raises(UserError, match=message) as err:
        make()
    assert err.value.field == field
    assert str(err.value).startswith(field + ": ")
    assert err.value.fix
