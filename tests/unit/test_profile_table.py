"""`ppsim profile`'s table: a row for each distinct layer cost it measured."""

from __future__ import annotations

from ppsim.cli.profile_text import layer_rows


def _layer(forward_ms: float) -> dict:
    return {"forward_ms": forward_ms, "backward_ms": 2 * forward_ms, "weight_grad_ms": 0.0}


def test_a_stack_of_two_kinds_shows_both() -> None:
    dense, moe = _layer(1.0), _layer(1.7)
    rows = layer_rows([dense, moe, dense, moe, dense])
    assert [(name, x) for name, _, x in rows] == [("layer 0 ×3", dense), ("layer 1 ×2", moe)]


def test_one_kind_is_one_row() -> None:
    assert [r[0] for r in layer_rows([_layer(1.0)] * 4)] == ["layer 0"]
    assert [r[0] for r in layer_rows([_layer(1.0)])] == ["layer"]
