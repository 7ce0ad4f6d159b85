"""The all-to-all dispatcher's second permutation (Megatron's token_dispatcher.py,
dispatch_postprocess and combine_preprocess: sort_chunks_by_idxs): with more than one
local expert a rank sorts the copies it received by local expert after the dispatch and
back before the combine, each a read and a write of them on the compute stream.
Closed forms from the h100-80gb preset's memory bandwidth, 3,000 GB/s."""

from __future__ import annotations

import pytest

from ppsim.config.schema import config_from_dict
from ppsim.costs.model import LayerCost
from ppsim.costs.transformer import accelerator
from ppsim.job.layers import ep_all_to_all_ms, layer_collectives, per_rank_arch
from ppsim.job.model import build_job
from ppsim.job.traffic import Collective, recomputed

BYTES_PER_MS = 3000e6


def _ep(preset: str, dispatcher: str = "alltoall", modules: tuple[str, ...] = ()
        ) -> tuple[float, Collective, Collective]:
    """(both all-to-alls' ms, the ep collective forward, backward) of a MoE layer at ep 8."""
    c = config_from_dict({"model": {"preset": preset, "ep": 8, "recompute": "none"},
                          "pipeline": {"pp": 1, "microbatches": 4,
                                       "moe_token_dispatcher_type": dispatcher},
                          "hardware": {"preset": "h100-80gb"}})
    job = build_job(c)
    assert job is not None
    a = per_rank_arch(job.arch)
    comm = layer_collectives(job, a, accelerator(c.hardware), "moe",
                             LayerCost(forward_ms=1.0, backward_ms=2.0), recomputed(a, modules))
    forward = next(x for x in comm.forward if x.group == "ep")
    backward = next(x for x in comm.backward if x.group == "ep")
    return ep_all_to_all_ms(job, a), forward, backward


def test_sixteen_local_experts_sort_their_copies_each_way() -> None:
    """Qwen3-30B-A3B at ep 8: 16 local experts; 4,096 tokens x 8 copies of 2,048 in bf16,
    sorted and sorted back, each a read and a write: 4 x 4096 x 8 x 2048 x 2 bytes each
    way, exposed (nothing hides compute-stream work)."""
    a2a, f, b = _ep("qwen3-30b-a3b")
    sort = 4 * 4096 * 8 * 2048 * 2 / BYTES_PER_MS
    assert f.total_ms == pytest.approx(a2a + sort)
    assert f.exposed_ms == pytest.approx(a2a + sort)
    assert b.total_ms == pytest.approx(a2a + sort)


def test_a_recomputed_moe_block_sorts_again_in_its_backward() -> None:
    a2a, _, b = _ep("qwen3-30b-a3b", modules=("moe",))
    assert b.total_ms == pytest.approx(2 * (a2a + 4 * 4096 * 8 * 2048 * 2 / BYTES_PER_MS))


@pytest.mark.parametrize("preset, dispatcher", [("mixtral-8x7b", "alltoall"),
                                                ("qwen3-30b-a3b", "flex")])
def test_one_local_expert_or_deepep_sorts_nothing(preset: str, dispatcher: str) -> None:
    """Mixtral's 8 experts at ep 8 are one a rank; DeepEP's dispatcher permutes once."""
    a2a, f, _ = _ep(preset, dispatcher)
    assert f.total_ms == pytest.approx(a2a)
