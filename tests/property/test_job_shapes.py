"""The job search's shapes with some sizes held (`plan --gpus N --tp 8 ...`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.job.shapes import FIXABLE, shapes

ARCHS = {name: config_from_dict({"model": {"preset": name}}).model.arch
         for name in ("llama3-8b", "mixtral-8x7b")}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(ARCHS)), gpus=st.sampled_from([8, 16, 48, 64, 256]),
       gbs=st.sampled_from([16, 64, 96, 512]), data=st.data())
def test_holding_sizes_keeps_exactly_the_shapes_that_have_them(name, gpus, gbs, data) -> None:
    a = ARCHS[name]
    free = shapes(a, gpus, gbs, 8, a.num_layers)
    keys = data.draw(st.lists(st.sampled_from(FIXABLE), unique=True, max_size=3))
    # Values the free search tries (so holding them can only filter), or any size.
    pool = {k: sorted({getattr(s, k) for s in free}) or [1] for k in FIXABLE}
    fixed = {k: data.draw(st.sampled_from(pool[k])) for k in keys}
    held = shapes(a, gpus, gbs, 8, a.num_layers, fixed)
    assert held == [s for s in free if all(getattr(s, k) == v for k, v in fixed.items())]
    for s in held:
        assert s.tp * s.cp * s.pp * s.dp == gpus
        assert s.mbs * s.microbatches * s.dp == gbs
