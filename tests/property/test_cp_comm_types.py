"""Context parallelism's traffic types on random jobs: each adds to a layer exactly what
it leaves exposed (the attention work is the same 1 / cp of the sequence's), what is
exposed is never negative nor more than the traffic, and the all-gather and the
all-to-alls are never hidden."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.layers import layer_collectives, per_rank_arch
from ppsim.job.model import build_job
from ppsim.pipeline.problem import model_costs


def _cfg(kind: str, tp: int, cp: int, seq: int, per_node: int):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 2, "tp": tp,
                                       "cp": cp, "seq_length": seq, "cp_comm_type": kind},
                             "pipeline": {"pp": 1, "microbatches": 2},
                             "hardware": {"preset": "h100-80gb", "gpus_per_node": per_node}})


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 8]), st.sampled_from([2, 4, 8]),
       st.integers(1, 16).map(lambda k: 1024 * k))
def test_each_type_adds_its_exposed_traffic(tp: int, cp: int, per_node: int,
                                            seq: int) -> None:
    seq = seq * cp
    spent = {}
    ulysses = (8 // tp) % cp == 0  # llama3-8b's 8 key/value heads over tp, then cp
    for kind in ("p2p", "all_gather", "a2a") if ulysses else ("p2p", "all_gather"):
        c = _cfg(kind, tp, cp, seq, per_node)
        job = build_job(c)
        assert job is not None
        acc = accelerator(c.hardware)
        a = per_rank_arch(job.arch)
        comm = layer_collectives(job, a, acc, "dense", transformer_costs(a, acc).layers[0])
        cps = [x for x in (*comm.forward, *comm.backward) if x.group == "cp"]
        assert len(cps) == 2
        for x in cps:
            assert 0.0 <= x.exposed_ms <= x.total_ms + 1e-12
            if kind != "p2p":
                assert x.exposed_ms == x.total_ms > 0
        layer = model_costs(c).layers[0]
        spent[kind] = layer.forward_ms + layer.backward_ms - sum(x.exposed_ms for x in cps)
    assert spent["all_gather"] == pytest.approx(spent["p2p"])
    if ulysses:
        assert spent["a2a"] == pytest.approx(spent["p2p"])
