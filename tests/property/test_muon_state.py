"""Muon on random models and shapes: a decoder layer holds exactly 4 bytes a weight of
its matrices less than under Adam, spread as the distributed optimizer spreads the rest
of its state (the norms, the embedding and the output layer keep Adam's), and the
tensor-parallel modes order as their work does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.kinds import any_kind_params
from ppsim.costs.muon import newton_schulz
from ppsim.costs.stack import layer_kinds
from ppsim.costs.state import optimizer_shards
from ppsim.costs.transformer import accelerator
from ppsim.pipeline.problem import model_costs

PRESETS = ["llama3-8b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "nemotron-h-8b"]


def _cfg(preset: str, tp: int, dp: int, sharded: bool, optimizer: str):
    return config_from_dict({"model": {"preset": preset, "tp": tp, "dp": dp, "ep": 1,
                                       "distributed_optimizer": sharded,
                                       "optimizer": optimizer},
                             "pipeline": {"pp": 1, "microbatches": 1},
                             "hardware": {"preset": "h100-80gb"}})


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(PRESETS), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 8, 64]),
       st.booleans())
def test_a_layer_holds_four_bytes_a_weight_less(preset: str, tp: int, dp: int,
                                                sharded: bool) -> None:
    adam, muon = (model_costs(_cfg(preset, tp, dp, sharded, o)) for o in ("adam", "muon"))
    arch = _cfg(preset, tp, dp, sharded, "muon").model.arch
    dense, experts = optimizer_shards(arch), optimizer_shards(arch, experts=True)
    for a, m, kind in zip(adam.layers, muon.layers, layer_kinds(arch), strict=True):
        norms = any_kind_params(arch, kind).norms  # whole on every rank, on Adam
        saved = 4 * ((a.params - a.expert_params - norms) / dense + a.expert_params / experts)
        assert a.static_bytes - m.static_bytes == pytest.approx(saved, abs=2)
    assert muon.head.static_bytes == adam.head.static_bytes
    assert muon.embedding.static_bytes == adam.embedding.static_bytes


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(PRESETS), st.sampled_from([1, 2, 4]))
def test_duplicated_does_the_whole_matrix_on_every_tensor_rank(preset: str, tp: int) -> None:
    def ns(mode: str):
        c = config_from_dict({"model": {"preset": preset, "tp": tp, "muon_tp_mode": mode},
                              "hardware": {"preset": "h100-80gb"}})
        return newton_schulz(c.model.arch, accelerator(c.hardware))
    dup, dist, block = ns("duplicated"), ns("distributed"), ns("blockwise")
    assert dist.dense <= dup.dense and block.dense <= dup.dense * (1 + 1e-9)
    if tp == 1:
        assert dist.dense == pytest.approx(dup.dense) == pytest.approx(block.dense)
