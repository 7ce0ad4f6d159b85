"""The order a job search prices its shapes in (ppsim.job.pricing.spread): every shape
once; the first of each (tp, cp, pp) before the second of any, so any prefix a deadline
leaves samples the whole grid; within one, the order given."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ppsim.job.pricing import spread
from ppsim.job.shapes import Shape

SHAPES = st.lists(st.builds(Shape, tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
                            pp=st.sampled_from([1, 2, 3]), ep=st.just(1),
                            dp=st.integers(1, 4), vpp=st.just(1),
                            mbs=st.sampled_from([1, 2, 4]), microbatches=st.integers(1, 8)),
                  max_size=60)


def _grid(s: Shape) -> tuple[int, int, int]:
    return s.tp, s.cp, s.pp


@given(SHAPES)
def test_spread_takes_each_grid_point_in_turn(todo: list[Shape]) -> None:
    order = spread(todo)
    assert sorted(order) == list(range(len(todo)))
    seen: dict[tuple[int, int, int], int] = {}
    turn = []  # each shape's place among its grid point's
    for i in order:
        g = _grid(todo[i])
        seen[g] = seen.get(g, 0) + 1
        turn.append(seen[g])
    assert turn == sorted(turn)  # all first ones, then all second ones, ...
    for g in set(map(_grid, todo)):
        mine = [i for i in order if _grid(todo[i]) == g]
        assert mine == sorted(mine)
