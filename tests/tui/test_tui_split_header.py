"""The split editor's header names each column apart, each name over its rows'
values, "layers" over the layer bars."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ppsim.pipeline.split import Split
from ppsim.tui.split_editor import COMPACT, COMPACT_HEADER, HEADER, PREFIX, row_prefix


@given(pp=st.integers(1, 99), vpp=st.integers(1, 3), compact=st.booleans(),
       data=st.data())
def test_each_header_name_stands_apart_over_its_column(pp: int, vpp: int, compact: bool,
                                                       data: st.DataObject) -> None:
    counts = tuple(data.draw(st.lists(st.integers(1, 30), min_size=pp * vpp,
                                      max_size=pp * vpp)))
    split = Split(counts, pp, vpp)
    header = COMPACT_HEADER if compact else HEADER
    names = header.split()
    assert names[:4] == ["stg", "rk", "ch", "lay"]
    for i in range(split.num_stages):
        row = row_prefix(split, i, compact=compact)
        st_ = split.stages[i]
        # the rank's "rN" and the chunk's "cN" start where their names start
        assert row[header.index(" rk ") + 1:].startswith(f"r{st_.rank}")
        assert row[header.index(" ch ") + 1:].startswith(f"c{st_.chunk}")
        # the layer count ends where its name ends
        lay_end = header.index(" lay") + 4
        assert row[:lay_end].endswith(f" {st_.layers}")
        if not compact:
            assert row[:header.index("first") + 5].endswith(f" {st_.offset}")
    # the layer bars start under "layers"
    assert header.index("layers") == (COMPACT if compact else PREFIX)
