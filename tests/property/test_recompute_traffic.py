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
from ppsim.costs.layerops import attention_ops
from ppsim.costs.ops import op_times
from ppsim.costs.transformer import accelerator
from ppsim.job.cp_traffic import cp_comm
from ppsim.job.layers import per_rank_arch
from ppsim.job.model import build_job
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


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b"]), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2, 4]), st.sampled_from(["p2p", "all_gather"]),
       st.integers(4, 8).map(lambda k: 1024 * k))  # a core above one kernel's floor
def test_selective_recompute_adds_the_whole_core_attention(preset: str, tp: int, cp: int,
                                                          kind: str, seq: int) -> None:
    """Megatron's selective recompute (the core attention) runs, inside the backward, the
    attention core over this rank's whole share of the sequence (cp chunks' worth under
    causal load balancing) and its context-parallel traffic again; nothing else."""
    def cfg(recompute: str):
        return config_from_dict({
            "model": {"preset": preset, "num_layers": 2, "tp": tp, "cp": cp, "dp": 8,
                      "seq_length": seq * cp, "cp_comm_type": kind, "recompute": recompute},
            "pipeline": {"pp": 1, "microbatches": 2},
            "hardware": {"preset": "h100-80gb"}})

    c = cfg("none")
    job = build_job(c)
    assert job is not None
    acc = accelerator(c.hardware)
    a = per_rank_arch(job.arch)
    core = next(op for op in attention_ops(a) if op.attention)
    forward_ms = op_times(acc.roofline(), core)[0]  # one chunk's causal core
    traffic = cp_comm(job, a, acc, False).exposed_ms if cp > 1 else 0.0
    plain, selective = model_costs(c).layers[0], model_costs(cfg("selective")).layers[0]
    assert selective.backward_ms - plain.backward_ms == pytest.approx(
        cp * forward_ms + traffic, rel=1e-9)
