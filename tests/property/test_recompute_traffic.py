"""Full recompute runs a layer's whole forward again inside its backward, its traffic
included: on random jobs (tensor, context and expert parallel, each context-parallel
traffic type, inside or across nodes, no overlaps) the backward of a fully recomputed
layer is the backward of one that recomputes nothing plus that layer's forward. Two
defects broke it: a context-parallel rank recomputed only its own chunk's attention, and
the MoE dispatcher's all-to-alls were not run again."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import model_costs


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b"]), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 8]),
       st.sampled_from(["p2p", "all_gather", "a2a"]), st.sampled_from([4, 8]),
       st.integers(1, 8).map(lambda k: 1024 * k))
def test_full_recompute_adds_the_forward(preset: str, tp: int, cp: int, ep: int, kind: str,
                                         per_node: int, seq: int) -> None:
    if preset == "llama3-8b":
        ep = 1
    if kind == "a2a" and (8 // tp) % cp:  # 8 key/value heads over tp, then cp
        kind = "all_gather"

    def layer(recompute: str):
        return model_costs(config_from_dict({
            "model": {"preset": preset, "num_layers": 2, "tp": tp, "cp": cp, "ep": ep,
                      "dp": 8, "seq_length": seq * cp, "cp_comm_type": kind,
                      "recompute": recompute},
            "pipeline": {"pp": 1, "microbatches": 2},
            "hardware": {"preset": "h100-80gb", "gpus_per_node": per_node}})).layers[0]

    plain, full = layer("none"), layer("full")
    assert full.forward_ms == pytest.approx(plain.forward_ms)
    assert full.backward_ms == pytest.approx(plain.backward_ms + plain.forward_ms, rel=1e-9)
