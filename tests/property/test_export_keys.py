"""Every split gives every export key (`split --json`, `plan --json`'s best): a form a
framework cannot take is null beside a note saying why, never absent, so a script reads
the same keys whatever the split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.pipeline.exports import split_exports
from ppsim.pipeline.split import Split

FORMS = {"megatron_flags": "megatron_note",
         "torchtitan_module_fqns_per_model_part": "torchtitan_note",
         "deepspeed_boundaries": "deepspeed_note"}
DERIVED = ("deepspeed_specs", "deepspeed_partition_override")
"""Read off the DeepSpeed boundaries: null with them."""


@st.composite
def splits(draw: st.DrawFn) -> Split:
    placement = draw(st.sampled_from(["loop", "loop", "v"]))
    vpp = 2 if placement == "v" else draw(st.integers(1, 3))
    pp = draw(st.integers(1, 4))
    counts = tuple(draw(st.lists(st.integers(0, 4), min_size=pp * vpp, max_size=pp * vpp)))
    return Split(counts, pp, vpp, placement)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(splits())
def test_every_export_key_is_there_and_a_null_one_says_why(split: Split) -> None:
    out = split_exports(split)
    for form, note in FORMS.items():
        assert form in out
        assert (out[form] is None) == (note in out), (form, out.get(note))
        if out[form] is None:
            assert out[note]
    for key in DERIVED:
        assert key in out, key
        assert (out[key] is None) == (out["deepspeed_boundaries"] is None), key
