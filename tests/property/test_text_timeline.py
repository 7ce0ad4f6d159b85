"""`ppsim simulate`'s text timeline: a cell shows what fills most of its time.

Before, each op painted the cell its rounded start fell in and the last one painted
won, so a cell spanning many microbatches showed whichever op aliased with the cell
grid: a 1F1B steady state (a B twice as long as each F) could read as all F, and a
rank idle most of the time as fully busy. A rank busy for less than half of a cell
reads '░', one idle throughout '.': a lightly loaded first stage (DeepSeek-V3's three
dense layers among MoE stages) does not read as doing nothing."""

from __future__ import annotations

from bisect import bisect_right
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.render import text_timeline

SAMPLES = 100
"""Points per cell at which the reference looks up what runs."""


def _op(kind: str, mb: int, start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(start=start, end=end,
                           action=SimpleNamespace(kind=kind, microbatch=mb))


def _cells(ops: list[SimpleNamespace], end_ms: float, width: int) -> str:
    text = text_timeline([ops], end_ms, width=width)[0].plain
    return text[len("rank 0  "):]


def _reference_shares(ops: list[SimpleNamespace], end_ms: float, width: int, x: int
                      ) -> tuple[dict[str, float], float]:
    """Each kind's share of cell x and the idle share, by sampling the cell's time (ops
    one after another, so the op at t is the last one starting at or before it), and
    the sampling's error bound: half a sample per op edge inside the cell, each side."""
    starts = [op.start for op in ops]
    shares = dict.fromkeys("FBW.", 0.0)
    cell = end_ms / width
    lo, hi = x * cell, (x + 1) * cell
    for i in range(SAMPLES):
        t = lo + (i + 0.5) / SAMPLES * cell
        k = bisect_right(starts, t) - 1
        running = ops[k].action.kind if k >= 0 and t < ops[k].end else "."
        shares[running] += 1 / SAMPLES
    edges = sum(lo < e < hi for op in ops for e in (op.start, op.end))
    return shares, (edges + 1) / SAMPLES


@st.composite
def _rank(draw: st.DrawFn) -> tuple[list[SimpleNamespace], float]:
    """One rank's ops one after another, with idle gaps between some of them."""
    ops, t = [], 0.0
    for mb in range(draw(st.integers(1, 60))):
        t += draw(st.sampled_from([0.0, 0.0, 0.5, 3.0]))
        length = draw(st.floats(0.2, 6.0))
        ops.append(_op(draw(st.sampled_from("FBW")), mb, t, t + length))
        t += length
    return ops, t + draw(st.sampled_from([0.0, 2.0]))


@given(_rank(), st.integers(5, 60))
def test_each_cell_shows_what_fills_most_of_it(rank, width) -> None:
    ops, end_ms = rank
    cells = _cells(ops, end_ms, width)
    assert len(cells) == width
    for x, ch in enumerate(cells):
        shares, error = _reference_shares(ops, end_ms, width, x)
        work = {k: v for k, v in shares.items() if k != "."}
        if abs(shares["."] - 0.5) <= error:
            continue  # as good as a tie between busy and idle: either answer is right
        if shares["."] > 0.5:
            cell = end_ms / width
            touched = any(op.start < (x + 1) * cell and op.end > x * cell for op in ops)
            assert ch == ("░" if touched else "."), (x, shares)
            continue
        top = sorted(work.values())
        if top[-1] - top[-2] > 2 * error:  # a clear winner among the kinds
            assert ch.upper() == max(work, key=work.__getitem__), (x, shares)


@pytest.mark.parametrize("width", [7, 10, 13, 70])
def test_a_steady_1f1b_rank_reads_as_two_bs_to_each_f(width: int) -> None:
    """F 1 ms, B 2 ms, 300 times: every cell of 7 to 70 holds twice as much B as F (the
    old painting showed 'bFfbBbB' at 7 cells, a third F at 70)."""
    ops = []
    for mb in range(300):
        ops += [_op("F", mb, 3.0 * mb, 3.0 * mb + 1), _op("B", mb, 3.0 * mb + 1, 3.0 * mb + 3)]
    assert set(_cells(ops, 900.0, width).upper()) == {"B"}


def test_a_rank_busy_a_quarter_of_the_time_reads_as_partly_busy_not_idle() -> None:
    """1 ms of work every 4 ms: busy a quarter of every cell, so '░', not '.' (a
    rank idle throughout), and not 'F' (as the old painting had it)."""
    ops = [_op("F", mb, 4.0 * mb, 4.0 * mb + 1) for mb in range(200)]
    assert _cells(ops, 800.0, 20) == "░" * 20
    assert _cells(ops, 1600.0, 20) == "░" * 10 + "." * 10


def test_long_ops_keep_their_microbatch_parity_and_the_gaps() -> None:
    ops = [_op("F", 0, 0.0, 4.0), _op("F", 1, 4.0, 8.0), _op("B", 0, 12.0, 16.0)]
    assert _cells(ops, 16.0, 16) == "FFFFffff....BBBB"
