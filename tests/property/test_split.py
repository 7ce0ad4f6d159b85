"""Tests for ppsim.split.

Expected values come from Megatron-LM's own unit tests, from hand calculation, or from
an independent re-implementation of Megatron's code written here the way Megatron
writes it (per pipeline rank and virtual stage), never from ppsim itself.
"""

from __future__ import annotations

import argparse
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import add_config_flags, config_from_args
from ppsim.errors import UserError
from ppsim.pipeline.exports import (
    deepspeed_boundaries,
    megatron_flags,
    megatron_layout_flag,
    torchtitan_fqns,
)
from ppsim.pipeline.layout import parse_layout, to_layout
from ppsim.pipeline.problem import resolve_split
from ppsim.pipeline.split import Split, even_split, megatron_split, split_from_counts

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- Megatron as Megatron writes it -------------------------------------------------------
# megatron/core/transformer/transformer_config.py (__post_init__), transformer_block.py
# (get_num_layers_to_build), transformer_layer.py (get_transformer_layer_offset) and
# megatron/training/arguments.py. vp is None when there are no virtual stages.


def ref_validate(L, pp, vp, first, last, emb, loss):
    """Raise ValueError wherever Megatron refuses the configuration."""
    if vp is not None and pp < 2:
        raise ValueError("interleaved schedule needs pp > 1")  # arguments.py
    if (first is not None or last is not None) and (emb or loss):
        raise ValueError("first/last cannot be set with account_for_*")
    if first is not None or last is not None:
        stages, layers = pp, L
        for n in (first, last):
            if n is None:
                continue
            if n <= 0:
                raise ValueError("must be larger than 0")
            if vp is not None and n % vp:
                raise ValueError("must be divisible by virtual pipeline parallel degree")
            layers -= n
            stages -= 1
        if bool(layers) != bool(stages):
            raise ValueError("Mismatch: middle layers remaining but middle PP stages available")
        if stages and layers % stages:
            raise ValueError("number of layers at middle stage must be divisible")
        if stages and vp is not None and (layers // stages) % vp:
            raise ValueError("number of layers on each middle pipeline rank")
    elif emb or loss:
        n = L + emb + loss
        if n % pp:
            raise ValueError("num_layers after account_for_* must be divisible by pp")
        if vp is not None and (n // pp) % vp:
            raise ValueError("number of layers on each pipeline rank must be divisible by vp")


def ref_num_layers_to_build(L, pp, vp, first, last, emb, loss, vp_stage, pp_rank):
    is_first, is_last = pp_rank == 0, pp_rank == pp - 1
    if first is not None or last is not None:
        left, stages_left = L, pp
        if first is not None:
            left -= first
            stages_left -= 1
        if last is not None:
            left -= last
            stages_left -= 1
        if stages_left > 0:
            assert left % stages_left == 0
            per_rank = left // stages_left
        else:
            per_rank = 0
        if is_first and first is not None:
            per_rank = first
        if is_last and last is not None:
            per_rank = last
    else:
        n = L + emb + loss
        assert n % pp == 0, "num_layers should be divisible by pipeline_model_parallel_size"
        per_rank = n // pp
    if vp is not None and pp > 1:
        assert per_rank % vp == 0
        build = per_rank // vp
    else:
        build = per_rank
    vp_first = vp is None or vp_stage == 0
    vp_last = vp is None or vp_stage == vp - 1
    if emb and vp_first and is_first:
        build -= 1
    if loss and vp_last and is_last:
        build -= 1
    return build


def ref_offset(L, pp, vp, first, last, emb, loss, vp_stage, pp_rank):
    if pp == 1:
        return 0
    if first is not None or last is not None:
        middle_stages = pp - (first is not None) - (last is not None)
        f = 0 if first is None else first
        la = 0 if last is None else last
        middle_layers = L - f - la
        middle_rank = pp_rank if first is None else pp_rank - 1
        if vp is not None:
            f_chunk = 0 if first is None else first // vp
            l_chunk = 0 if last is None else last // vp
            m_chunk = middle_layers // vp
            total = f_chunk + m_chunk + l_chunk
            if pp_rank == 0:
                return vp_stage * total
            # Megatron divides by middle_stages here, which is 0 for pp = 2 with both set.
            return vp_stage * total + f_chunk + middle_rank * (m_chunk // middle_stages)
        per_rank = middle_layers // middle_stages if middle_stages > 0 else 0
        return 0 if pp_rank == 0 else middle_rank * per_rank + f
    n = L + emb + loss
    per_rank = n // pp
    not_first = not ((vp is None or vp_stage == 0) and pp_rank == 0)
    if vp is not None:
        offset = vp_stage * (n // vp) + pp_rank * (per_rank // vp)
    else:
        offset = pp_rank * per_rank
    return offset - (1 if emb and not_first else 0)


def megatron_parse(layout):
    """Megatron's parse_str_to_list: strip commas, unroll (...)*n then x*n, split on '|'."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return [list(stage) for stage in s.split("|")]


def args(L, pp, vpp=1, first=None, last=None, emb=False, loss=False):
    return (L, pp, None if vpp == 1 else vpp, first, last, emb, loss)


def call(L, pp, vpp=1, first=None, last=None, emb=False, loss=False):
    return megatron_split(L, pp, vpp, first, last, emb, loss)


def offsets(split):
    return [s.offset for s in split.stages]


# --- Megatron's own test vectors ----------------------------------------------------------


# tests/unit_tests/transformer/test_transformer_block.py::test_layer_builder (accepted rows);
# Megatron only checks that the counts add up, the exact counts are worked out by hand.
@pytest.mark.parametrize(
    "L, pp, vpp, emb, loss, first, last, counts",
    [
        (60, 5, 1, False, False, None, 4, (14, 14, 14, 14, 4)),
        (60, 8, 1, False, False, 6, 6, (6, 8, 8, 8, 8, 8, 8, 6)),
        (64, 4, 1, False, False, None, None, (16, 16, 16, 16)),
        (64, 4, 8, False, False, None, None, (2,) * 32),
        (60, 6, 1, False, False, 5, None, (5, 11, 11, 11, 11, 11)),
        (63, 4, 1, True, False, None, None, (15, 16, 16, 16)),
        (63, 4, 1, False, True, None, None, (16, 16, 16, 15)),
        (62, 4, 1, True, True, None, None, (15, 16, 16, 15)),
        (62, 4, 2, True, True, None, None, (7, 8, 8, 8, 8, 8, 8, 7)),
    ],
)
def test_megatron_layer_builder_vectors(L, pp, vpp, emb, loss, first, last, counts):
    split = call(L, pp, vpp, first, last, emb, loss)
    assert split.counts == counts
    assert split.num_layers == L
    assert offsets(split) == [sum(counts[:i]) for i in range(len(counts))]


# The rows of the same test that Megatron expects to fail.
@pytest.mark.parametrize(
    "L, pp, vpp, emb, loss, first, last",
    [
        (101, 8, 1, False, False, 13, 13),
        (65, 4, 1, False, False, None, None),
        (65, 4, 1, True, True, None, None),
        (61, 4, 1, False, False, 12, None),
        (2, 4, 1, False, False, None, None),
        (60, 6, 1, True, False, 5, 5),
        (50, 2, 7, False, False, None, None),
        (4, 4, 4, False, False, None, None),
    ],
)
def test_megatron_layer_builder_rejections(L, pp, vpp, emb, loss, first, last):
    with pytest.raises(UserError) as err:
        call(L, pp, vpp, first, last, emb, loss)
    assert str(err.value).startswith("pipeline.")


# tests/unit_tests/transformer/test_transformer_layer.py::test_get_layer_offset_parametrized:
# {(pp_rank, vp_stage): offset}.
@pytest.mark.parametrize(
    "L, first, last, expected",
    [
        (30, 8, 10, {(0, 0): 0, (0, 1): 15, (1, 0): 4, (1, 1): 19, (2, 0): 7, (2, 1): 22,
                     (3, 0): 10, (3, 1): 25}),
        (26, 8, None, {(0, 0): 0, (0, 1): 13, (1, 0): 4, (1, 1): 17, (2, 0): 7, (2, 1): 20,
                       (3, 0): 10, (3, 1): 23}),
        (26, None, 8, {(0, 0): 0, (0, 1): 13, (1, 0): 3, (1, 1): 16, (2, 0): 6, (2, 1): 19,
                       (3, 0): 9, (3, 1): 22}),
        (24, None, None, {(0, 0): 0, (0, 1): 12, (1, 0): 3, (1, 1): 15, (2, 0): 6, (2, 1): 18,
                          (3, 0): 9, (3, 1): 21}),
    ],
)  # fmt: skip
def test_megatron_offset_vectors(L, first, last, expected):
    split = call(L, 4, 2, first, last)
    got = {(s.rank, s.chunk): s.offset for s in split.stages}
    assert got == expected
    for (rank, chunk), off in expected.items():
        assert ref_offset(*args(L, 4, 2, first, last), chunk, rank) == off


# Hand-checked: the embedding / loss take a layer's place on their own virtual stage.
def test_account_for_with_virtual_stages_by_hand():
    # 30 + 1 + 1 = 32 over pp 4 x vpp 2: 4 per stage, stage 0 and stage 7 one fewer.
    split = call(30, 4, 2, emb=True, loss=True)
    assert split.counts == (3, 4, 4, 4, 4, 4, 4, 3)
    assert offsets(split) == [0, 3, 7, 11, 15, 19, 23, 27]
    # 31 + 1 = 32 over pp 2 x vpp 4: only stage 0 shrinks.
    split = call(31, 2, 4, emb=True)
    assert split.counts == (3, 4, 4, 4, 4, 4, 4, 4)
    assert [s.rank for s in split.stages] == [0, 1] * 4
    # Loss only, no virtual stages.
    assert call(7, 2, loss=True).counts == (4, 3)


def test_even_split_and_pp1():
    assert even_split(32, 4).counts == (8, 8, 8, 8)
    assert even_split(32, 4, 2).counts == (4,) * 8
    assert megatron_split(13, 1).counts == (13,)
    assert megatron_split(13, 1, first_stage_layers=13).counts == (13,)
    # Megatron reads only `last` on its single stage, so this passes there too.
    assert megatron_split(13, 1, first_stage_layers=5, last_stage_layers=13).counts == (13,)
    assert megatron_split(13, 1, account_for_embedding=True, account_for_loss=True).counts == (13,)
    with pytest.raises(UserError, match="divisible by the pipeline-model-parallel size"):
        even_split(30, 4)
    with pytest.raises(UserError, match="vpp=3"):
        even_split(32, 4, 3)


def test_pp2_vpp_first_last_is_the_split_megatron_means():
    # Megatron accepts this, builds the right counts, then divides by zero for rank 1's offset.
    cfg = args(12, 2, 2, 4, 8)
    ref_validate(*cfg)
    with pytest.raises(ZeroDivisionError):
        ref_offset(*cfg, 0, 1)
    split = call(12, 2, 2, 4, 8)
    assert split.counts == (2, 4, 2, 4)
    assert offsets(split) == [0, 2, 6, 8]
    assert [(s.rank, s.chunk) for s in split.stages] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    for s in split.stages:
        assert s.layers == ref_num_layers_to_build(*cfg, s.chunk, s.rank)
    assert split.rank_layers(0) == 4 and split.rank_layers(1) == 8


@FAST
@given(st.integers(2, 4), st.integers(1, 5), st.integers(1, 5))
def test_pp2_vpp_first_last_property(vpp, a, b):
    first, last = a * vpp, b * vpp
    cfg = args(first + last, 2, vpp, first, last)
    split = call(first + last, 2, vpp, first, last)
    assert [s.layers for s in split.stages] == [
        ref_num_layers_to_build(*cfg, s.chunk, s.rank) for s in split.stages
    ]
    assert offsets(split) == [sum(split.counts[:i]) for i in range(2 * vpp)]
    assert (split.rank_layers(0), split.rank_layers(1)) == (first, last)


# --- Property: agreement with Megatron wherever Megatron is right --------------------------


@st.composite
def megatron_configs(draw):
    pp = draw(st.integers(1, 8))
    vpp = 1 if pp == 1 else draw(st.sampled_from([1, 1, 2, 3, 4]))
    if draw(st.booleans()):  # anything at all: mostly rejected
        L = draw(st.integers(1, 64))
        first = draw(st.none() | st.integers(-1, 24))
        last = draw(st.none() | st.integers(-1, 24))
        emb, loss = draw(st.booleans()), draw(st.booleans())
        return L, pp, vpp, first, last, emb, loss
    kind = draw(st.sampled_from(["even", "uneven", "account"]))
    if kind == "account":
        emb, loss = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
        n = pp * vpp * draw(st.integers(1, 4))
        assume(n - emb - loss >= 1)
        return n - emb - loss, pp, vpp, None, None, emb, loss
    if kind == "even":
        return pp * vpp * draw(st.integers(1, 4)), pp, vpp, None, None, False, False
    first = draw(st.none() | st.integers(1, 4).map(lambda k: k * vpp))
    last = draw(st.none() | st.integers(1, 4).map(lambda k: k * vpp))
    middle = pp - (first is not None) - (last is not None)
    per_middle = vpp * draw(st.integers(1, 4)) if middle > 0 else 0
    L = (first or 0) + (last or 0) + per_middle * max(middle, 0)
    assume(L >= 1)
    return L, pp, vpp, first, last, False, False


@FAST
@given(megatron_configs())
def test_megatron_split_agrees_with_megatron(cfg):
    L, pp, vpp, first, last, emb, loss = cfg
    ref = args(*cfg)
    try:
        ref_validate(*ref)
        built = {(r, c): ref_num_layers_to_build(*ref, c, r) for r in range(pp) for c in range(vpp)}
    except (ValueError, AssertionError):
        with pytest.raises(UserError):
            call(*cfg)
        return
    if sum(built.values()) != L or min(built.values()) < 0:
        # Megatron accepts this and then builds the wrong layers (e.g. first + last > L).
        with pytest.raises(UserError):
            call(*cfg)
        return
    split = call(*cfg)
    assert split.pp == pp and split.vpp == vpp and split.num_layers == L
    for s in split.stages:
        assert s.layers == built[(s.rank, s.chunk)]
        try:
            expected = ref_offset(*ref, s.chunk, s.rank)
        except ZeroDivisionError:
            assert pp == 2 and vpp > 1 and first is not None and last is not None
            continue
        assert s.offset == expected


@FAST
@given(megatron_configs())
def test_every_accepted_split_covers_each_layer_once_in_order(cfg):
    try:
        split = call(*cfg)
    except UserError:
        return
    L = cfg[0]
    assert split.num_layers == L
    covered = [k for s in split.stages for k in range(s.offset, s.offset + s.layers)]
    assert covered == list(range(L))
    for a, b in zip(split.stages, split.stages[1:], strict=False):
        assert b.offset == a.offset + a.layers
    assert split.stages[0].offset == 0 and split.stages[0].has_embedding
    assert split.stages[-1].has_head and not any(s.has_head for s in split.stages[:-1])


# --- Split itself --------------------------------------------------------------------------


def test_loop_and_v_placement():
    loop = Split((1, 2, 3, 4, 5, 6), pp=3, vpp=2)
    assert [(s.rank, s.chunk) for s in loop.stages] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)
    ]  # fmt: skip
    assert [loop.rank_layers(r) for r in range(3)] == [1 + 4, 2 + 5, 3 + 6]
    v = Split((1, 2, 3, 4, 5, 6), pp=3, vpp=2, placement="v")
    assert [(s.rank, s.chunk) for s in v.stages] == [
        (0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)
    ]  # fmt: skip
    assert [v.rank_layers(r) for r in range(3)] == [1 + 6, 2 + 5, 3 + 4]
    for split in (loop, v):
        for s in split.stages:
            assert split.stage_index(s.rank, s.chunk) == s.index
            assert split.stage_rank(s.index) == s.rank
            assert split.stage_chunk(s.index) == s.chunk
    assert split.num_stages == 6 and split.num_layers == 21


def test_split_normalises_and_compares_by_value():
    assert Split([2, 3], 2) == Split((2, 3), 2)
    assert hash(Split([2, 3], 2)) == hash(Split((2, 3), 2))
    assert split_from_counts([3, 5], 2, num_layers=8).counts == (3, 5)


# --- Layout grammar --------------------------------------------------------------------------


def test_layout_examples_from_megatron_and_reference():
    # parse_str_to_list's docstring example, with the MTP layer (DeepSeek-V3).
    split = parse_layout("Et*3|(tt|)*29,m|L", 16, num_layers=61, mtp_layers=1)
    assert split.counts == (3,) + (2,) * 29 + (1, 0) and split.mtp == 1
    assert split.stages[30].mtp == 1 and split.stages[31].has_head
    # The same with the MTP stage holding a decoder layer instead: pp 16 x vpp 2.
    split = parse_layout("Et*3|(tt|)*29,t|L", 16, num_layers=62)
    assert split.counts == (3,) + (2,) * 29 + (1, 0)
    assert (split.pp, split.vpp) == (16, 2)
    # TransformerConfig's docstring example, m swapped for t: 8 stages.
    split = parse_layout("E|(tt|)*2,(t|)*4,tL", 4)
    assert split.counts == (0, 2, 2, 1, 1, 1, 1, 1) and split.vpp == 2
    # Commas, x*n on a stage break, repeated symbols.
    assert parse_layout("Et*2,|ttL", 2).counts == (2, 2)
    assert parse_layout("Et|*3tL", 2).counts == (1, 0, 0, 1)
    assert parse_layout("EL", 1).counts == (0,)


@pytest.mark.parametrize(
    "layout, pp, message",
    [
        ("Et*3|(tt|*29,t|L", 2, "unbalanced parenthesis at column 6"),
        ("Et)|tL", 2, "unbalanced parenthesis at column 3"),
        ("Et|x|L", 3, "invalid layer character 'x' at column 4"),
        ("E t|tL", 2, "invalid layer character ' ' at column 2"),
        ("E((t|)*2)*2|L", 2, "nested parenthesis at column 3"),
        ("E(t|)|tL", 2, "'\\(' is left over"),
        ("E()*2|tL", 2, "'\\(' is left over"),
        ("Et*|tL", 2, "needs a count"),
        ("Et*2*3|tL", 2, "'\\*' is left over"),
        ("E*2t|tL", 2, "has 2 'E'"),
        ("Et|t", 2, "has 0 'L'"),
        ("tE|tL", 2, "the first layer is 't'"),
        ("Et|Lt", 2, "the last layer is 't'"),
        ("Ettt|tL", 1, "pipeline-model-parallel size should be greater than 1"),
        ("Et|t|t|t|tL", 2, "5 stages is not a multiple of pp=2"),
        ("", 1, "has 0 'E'"),
    ],
)
def test_layout_errors_say_what_and_where(layout, pp, message):
    with pytest.raises(UserError, match=message) as err:
        parse_layout(layout, pp)
    assert err.value.field == "pipeline.layout"
    assert str(err.value).startswith("pipeline.layout: ")


def test_layout_layer_count_must_match_model():
    with pytest.raises(UserError, match="has 3 decoder layers 't' but the model has 4"):
        parse_layout("Et|ttL", 2, num_layers=4)


def test_to_layout_examples():
    assert to_layout(Split((6, 2), 2)) == "Et*6|t*2L"
    assert to_layout(megatron_split(60, 8, 1, 6, 6)) == "Et*6|(t*8|)*6t*6L"
    assert to_layout(Split((1, 0, 0, 1), 2, 2)) == "Et|||tL"
    assert to_layout(Split((5,), 1)) == "Et*5L"


splits = st.integers(1, 6).flatmap(
    lambda pp: st.integers(1, 3 if pp > 1 else 1).flatmap(
        lambda vpp: st.lists(st.integers(0, 12), min_size=pp * vpp, max_size=pp * vpp).map(
            lambda counts: Split(tuple(counts), pp, vpp)
        )
    )
)


@FAST
@given(splits)
def test_layout_round_trip(split):
    text = to_layout(split)
    assert parse_layout(text, split.pp, split.num_layers) == split
    # Megatron's own regex parser reads the same stages.
    stages = megatron_parse(text)
    assert tuple(s.count("t") for s in stages) == split.counts
    assert stages[0][:1] == ["E"] and stages[-1][-1:] == ["L"]


@st.composite
def written_layouts(draw):
    """A layout written the way people write them: t or t*n, groups, commas."""
    counts = draw(st.lists(st.integers(0, 5), min_size=1, max_size=8))
    parts = []
    for i, n in enumerate(counts):
        body = draw(st.sampled_from(["t" * n, f"t*{n}"]))
        body = ("E" if i == 0 else "") + body + ("L" if i == len(counts) - 1 else "")
        repeat = draw(st.integers(1, 3)) if 0 < i < len(counts) - 1 else 1
        if repeat > 1:
            parts.append(f"({body}|)*{repeat}" + draw(st.sampled_from(["", ","])))
        else:
            parts.append(body + ("|" if i < len(counts) - 1 else ""))
    return "".join(parts)


@FAST
@given(written_layouts())
def test_parse_layout_agrees_with_megatron_parser(text):
    stages = megatron_parse(text)
    expected = tuple(s.count("t") for s in stages)
    split = parse_layout(text, len(stages))  # one stage per rank: any stage count parses
    assert split.counts == expected and split.num_stages == len(stages)


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
@given(splits | megatron_configs().map(lambda c: call(*c) if _accepted(c) else None))
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


def _accepted(cfg):
    try:
        call(*cfg)
    except UserError:
        return False
    return True


@FAST
@given(splits)
def test_torchtitan_fqns(split):
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
