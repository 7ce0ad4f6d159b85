"""Tests for ppsim.split: Megatron's counts and offsets, the split itself, the layout grammar.

Expected values come from Megatron-LM's own unit tests, from hand calculation, or from
an independent re-implementation of Megatron's code (tests/megatron_split_ref.py), never
from ppsim itself.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from megatron_split_ref import (
    FAST,
    args,
    call,
    megatron_configs,
    megatron_parse,
    offsets,
    ref_num_layers_to_build,
    ref_offset,
    ref_validate,
    splits,
)

from ppsim.errors import UserError
from ppsim.pipeline.layout import parse_layout, to_layout
from ppsim.pipeline.split import Split, even_split, megatron_split, split_from_counts

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
