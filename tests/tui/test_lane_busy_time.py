"""The TUI timeline shows a cell busy only when its rank is busy for most of it.

Before, a cell showed the first op that merely touched it: zoomed out, a rank idle for
nine tenths of the iteration (short ops far apart) drew as one solid busy bar, and a
lane of collectives taking a sixth of each op as solid communication."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from ppsim.tui.lanes import IDLE, PARTLY_BUSY, Lane, LaneOp, lane_cells


def _busy(ops: list[LaneOp], t0: float, t1: float) -> float:
    return sum(max(0.0, min(o.end, t1) - max(o.start, t0)) for o in ops)


def test_short_ops_far_apart_read_partly_busy_when_zoomed_out() -> None:
    ops = [LaneOp(float(k), k + 0.1, "F", 0, k, 0) for k in range(20)]  # busy 10 %
    cells = lane_cells(Lane("r0", ops), 2.0, 0, 12)
    assert "".join(c.text for c in cells) == "░" * 10 + "··"
    assert {c.op for c in cells} == {-1}
    # zoomed in, each op gets its cell
    assert sum(c.op >= 0 for c in lane_cells(Lane("r0", ops), 0.1, 0, 200)) == 20


def test_a_mostly_busy_cell_with_an_idle_midpoint_shows_the_larger_neighbour() -> None:
    ops = (LaneOp(0.0, 4.5, "F", 0, 0, 0), LaneOp(5.5, 6.0, "B", 0, 0, 0))
    lane = Lane("r0", ops)
    assert lane.overlapping(0.0, 11.0) == PARTLY_BUSY  # busy 5 of 11
    assert lane.overlapping(6.0, 9.0) == IDLE
    assert lane.overlapping(0.0, 8.0) == 0  # the midpoint's op
    assert lane.overlapping(2.0, 8.0) == 0  # busy 3 of 6, the midpoint idle: F has 2.5
    assert lane.overlapping(4.0, 7.0) == PARTLY_BUSY  # busy 1 of 3
    lane2 = Lane("r0", (LaneOp(0.0, 1.0, "F", 0, 0, 0), LaneOp(1.5, 4.0, "B", 0, 1, 0)))
    assert lane2.overlapping(0.0, 2.4) == 0  # the midpoint 1.2 is idle: F 1.0, B 0.9
    assert lane2.overlapping(0.2, 2.6) == 1  # F 0.8, B 1.1


@st.composite
def _lane_ops(draw: st.DrawFn) -> list[LaneOp]:
    ops, t = [], 0.0
    for mb in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 0.0, 0.3, 2.0]))
        length = draw(st.sampled_from([0.0, 0.1, 0.7, 1.0, 4.0]))
        ops.append(LaneOp(t, t + length, draw(st.sampled_from("FBW")), 0, mb, 0))
        t += length
    return ops


@given(_lane_ops(), st.floats(0.0, 60.0), st.floats(0.01, 30.0))
def test_a_cell_shows_an_op_exactly_when_the_rank_is_busy_for_half_of_it(
        ops: list[LaneOp], t0: float, width: float) -> None:
    t1 = t0 + width
    busy = _busy(ops, t0, t1)
    assume(abs(2 * busy - width) > 1e-9 * (1 + t1))  # not on the threshold to rounding
    assume(busy == 0 or busy > 1e-9 * (1 + t1))
    shown = Lane("r0", ops).overlapping(t0, t1)
    if busy == 0:
        assert shown == IDLE
        return
    if 2 * busy < width:
        assert shown == PARTLY_BUSY
        return
    assert shown >= 0
    op = ops[shown]
    assert min(op.end, t1) - max(op.start, t0) > 0  # it does work inside the cell
    mid = (t0 + t1) / 2
    covering = [k for k, o in enumerate(ops) if o.start <= mid < o.end]
    if covering:
        assert shown == covering[0]
