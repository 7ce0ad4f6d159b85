"""The all-to-all dispatcher's second permutation (Megatron's token_dispatcher.py,
dispatch_postprocess and combine_preprocess: sort_chunks_by_idxs): with more than one
local expert a rank sorts the copies it received by local expert after the dispatch and
back before the combine, each a read and a write of them on the compute stream: compute
in the layer, not communication. Closed forms from the h100-80gb preset's memory
bandwidth, 3,000 GB/s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ppsim.config.schema import config_from_dict
from ppsim.costs.model import LayerCost
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.layers import compute_costs, ep_all_to_all_ms, layer_collectives, per_rank_arch
from ppsim.job.model import build_job
from ppsim.job.traffic import recomputed

BYTES_PER_MS = 3000e6
QWEN_SORT = 4 * 4096 * 8 * 2048 * 2 / BYTES_PER_MS
"""Qwen3-30B-A3B at ep 8: 4,096 tokens x 8 copies of 2,048 in bf16, sorted and sorted
back, each a read and a write."""


def _extra(preset: str, dispatcher: str = "alltoall", modules: tuple[str, ...] = ()
           ) -> tuple[float, float]:
    """What the job's compute adds to a MoE layer's forward and backward at ep 8."""
    c = config_from_dict({"model": {"preset": preset, "ep": 8, "recompute": "none"},
                          "pipeline": {"pp": 1, "microbatches": 4,
                                       "moe_token_dispatcher_type": dispatcher},
                          "hardware": {"preset": "h100-80gb"}})
    job = build_job(c)
    assert job is not None
    a, acc = per_rank_arch(job.arch), accelerator(c.hardware)
    got = compute_costs(job, acc, modules)
    plain = transformer_costs(a, replace(acc, a2a_bandwidth_gbps=0.0), modules)
    at = got.kinds.index("moe")
    return (got.layers[at].forward_ms - plain.layers[at].forward_ms,
            got.layers[at].backward_ms - plain.layers[at].backward_ms)


def test_sixteen_local_experts_sort_their_copies_each_way() -> None:
    assert _extra("qwen3-30b-a3b") == pytest.approx((QWEN_SORT, QWEN_SORT))


def test_a_recomputed_moe_block_sorts_again_in_its_backward() -> None:
    assert _extra("qwen3-30b-a3b", modules=("moe",)) == pytest.approx(
        (QWEN_SORT, 2 * QWEN_SORT))


@pytest.mark.parametrize("preset, dispatcher", [("mixtral-8x7b", "alltoall"),
                                                ("qwen3-30b-a3b", "flex")])
def test_one_local_expert_or_deepep_sorts_nothing(preset: str, dispatcher: str) -> None:
    """Mixtral's 8 experts at ep 8 are one a rank; DeepEP's dispatcher permutes once."""
    assert _extra(preset, dispatcher) == (0.0, 0.0)


def test_the_sorts_are_not_communication() -> None:
    """The expert-parallel collective is the two all-to-alls alone."""
    c = config_from_dict({"model": {"preset": "qwen3-30b-a3b", "ep": 8},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    job = build_job(c)
    assert job is not None
    a = per_rank_arch(job.arch)
    comm = layer_collectives(job, a, accelerator(c.hardware), "moe",
                             LayerCost(forward_ms=1.0, backward_ms=2.0), recomputed(a, ()))
    ep = next(x for x in comm.forward if x.group == "ep")
    assert ep.total_ms == pytest.approx(ep_all_to_all_ms(job, a))
