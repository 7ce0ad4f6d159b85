"""The typed [model] sections: parsed once, saved back to an equal config, refused
with the field named."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.model import TransformerModel, UniformModel, parse_model
from ppsim.config.overrides import with_overrides
from ppsim.config.presets import MODEL_PRESETS
from ppsim.config.schema import config_from_dict, load_config, parse_toml
from ppsim.config.to_toml import config_to_toml
from ppsim.costs.model import LayerCost
from ppsim.errors import UserError


def _round_trip(table: dict) -> None:
    cfg = config_from_dict({"model": table})
    again = config_from_dict(parse_toml(config_to_toml(cfg)))
    assert again == cfg
    assert parse_model(cfg.model.to_dict()) == cfg.model


@pytest.mark.parametrize("preset", list(MODEL_PRESETS))
def test_every_preset_parses_to_a_transformer_and_saves_as_its_name(preset: str) -> None:
    m = parse_model({"preset": preset})
    assert isinstance(m, TransformerModel) and m.preset == preset
    assert m.to_dict() == {"preset": preset}
    assert m.num_layers == MODEL_PRESETS[preset]["num_layers"]
    assert m.total_layers == m.num_layers + MODEL_PRESETS[preset].get("mtp_layers", 0)
    _round_trip({"preset": preset, "recompute": "full", "tp": 2})


def test_a_uniform_model_keeps_its_layer_embedding_and_head() -> None:
    m = parse_model({"kind": "uniform", "num_layers": 6, "forward_ms": 2, "backward_ms": 4,
                     "activation_bytes": 10, "head": {"forward_ms": 1.5}})
    assert isinstance(m, UniformModel) and m.recompute is None and m.mtp_layers == 0
    assert m.layer == LayerCost(forward_ms=2.0, backward_ms=4.0, activation_bytes=10)
    assert m.head == LayerCost(forward_ms=1.5) and m.embedding is None
    _round_trip(m.to_dict())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.floats(0, 1e3), st.integers(0, 10**12),
       st.sampled_from(list(MODEL_PRESETS)), st.sampled_from(["none", "selective", "full"]),
       st.integers(1, 8))
def test_any_valid_table_round_trips(n: int, ms: float, nbytes: int, preset: str, rc: str,
                                     mbs: int) -> None:
    _round_trip({"kind": "uniform", "num_layers": n, "backward_ms": ms, "static_bytes": nbytes,
                 "embedding": {"output_bytes": nbytes}})
    _round_trip({"preset": preset, "num_layers": n, "recompute": rc, "micro_batch_size": mbs})


@pytest.mark.parametrize("table,where", [
    ({"kind": "uniform", "num_layers": 2, "tp": 2}, "model.tp"),
    ({"kind": "uniform", "num_layers": 2, "forward_ms": -1}, "model.forward_ms"),
    ({"kind": "uniform", "num_layers": 2, "head": {"fwd": 1}}, "model.head.fwd"),
    ({"preset": "tiny-gpt", "recompute": "some"}, "model.recompute"),
    ({"preset": "nope"}, "model.preset"),
    ({"kind": "transformer", "num_layers": 2}, "model.hidden_size"),
    ({"kind": "moe", "num_layers": 2}, "model.kind"),
    ({"preset": "tiny-gpt", "builder": "nocolon"}, "model.builder"),
])
def test_mistakes_name_the_field(table: dict, where: str) -> None:
    with pytest.raises(UserError) as exc:
        parse_model(table)
    assert exc.value.field == where


def test_overriding_a_uniform_model_with_a_transformer_field_is_refused() -> None:
    cfg = config_from_dict({"model": {"kind": "uniform", "num_layers": 4, "forward_ms": 1}})
    with pytest.raises(UserError, match="model.recompute"):
        with_overrides(cfg, model={"recompute": "full"})
    assert with_overrides(cfg, model={"num_layers": 6}).model.num_layers == 6
    assert load_config(None).model.fields()["kind"] == "transformer"
