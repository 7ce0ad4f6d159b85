"""The slices a builder's own parallelize keeps (ppsim.executor.builders.user_tp), put
back together in rank order, are the whole weights: column-parallel by output rows (each
packed segment alike), row-parallel by input columns, the embedding by vocabulary rows.
No process group: slicing runs no collective."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from ppsim.executor.builders.tensor import TensorGroup  # noqa: E402
from ppsim.executor.builders.user_tp import TensorParallel  # noqa: E402


def _ranks(tp: int) -> list[TensorParallel]:
    return [TensorParallel(TensorGroup(group=None, rank=r, size=tp, sequence_parallel=True))
            for r in range(tp)]


def _slices(whole: nn.Module, tp: int, split: Callable[[TensorParallel, Any], None]
            ) -> list[Any]:
    """Each tensor rank's copy of `whole`, `split` as that rank splits it."""
    parts = []
    for t in _ranks(tp):
        part = copy.deepcopy(whole)
        split(t, part)
        parts.append(part)
    return parts


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.lists(st.integers(1, 4), min_size=1, max_size=3),
       st.integers(1, 5), st.booleans())
def test_column_slices_rebuild_each_packed_segment(tp, units, width, bias) -> None:
    segments = tuple(u * tp for u in units)  # each segment's rows divide by tp
    whole = nn.Linear(width, sum(segments), bias=bias)
    parts = _slices(whole, tp, lambda t, lin: t.column(
        lin, segments=segments if len(segments) > 1 else ()))
    for name in ("weight", "bias") if bias else ("weight",):
        got = [getattr(p, name).detach().split([s // tp for s in segments]) for p in parts]
        want = getattr(whole, name).detach().split(list(segments))
        for i, seg in enumerate(want):
            assert torch.equal(torch.cat([g[i] for g in got]), seg)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.integers(1, 4), st.integers(1, 5))
def test_row_slices_rebuild_the_inputs_and_keep_the_bias_whole(tp, units, out) -> None:
    whole = nn.Linear(units * tp, out)
    parts = _slices(whole, tp, lambda t, lin: t.row(lin))
    assert torch.equal(torch.cat([p.weight.detach() for p in parts], 1), whole.weight.detach())
    assert all(torch.equal(p.bias.detach(), whole.bias.detach()) for p in parts)
    # added once after the sum, applied to each rank's tokens: a partial gradient
    assert all(getattr(p.bias, "partial_grad", False) for p in parts)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([2, 4]), st.integers(1, 6), st.integers(1, 4))
def test_vocabulary_rows_rebuild_the_table(tp, rows, dim) -> None:
    whole = nn.Embedding(rows * tp, dim)
    parts = _slices(whole, tp, lambda t, table: t.embedding(table))
    assert torch.equal(torch.cat([p.weight.detach() for p in parts]), whole.weight.detach())


def test_a_width_tp_does_not_divide_is_named() -> None:
    with pytest.raises(ValueError, match=r"output width \(10\) does not divide by tp \(4\)"):
        _ranks(4)[0].column(nn.Linear(3, 10))
