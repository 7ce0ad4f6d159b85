"""A hybrid stack's MTP module runs its own pattern's layers (Qwen3-Next: "/*E", an
attention layer and a MoE block), not one layer of the main stack's last kind: its
collectives and what the offload modules move off it are those layers' together."""

from __future__ import annotations

import pytest

from ppsim.config.model import parse_model
from ppsim.config.schema import config_from_dict
from ppsim.costs.kinds import kind_effect
from ppsim.costs.transformer import accelerator
from ppsim.job.layers import compute_costs, per_rank_arch
from ppsim.job.model import build_job
from ppsim.job.mtp_tp import eh_proj_collectives
from ppsim.pipeline.problem import model_costs
from ppsim.policy.costs import PolicyCosts

NEXT = parse_model({"preset": "qwen3-next-80b-a3b"}).arch  # type: ignore[union-attr]


def _cfg(**model):
    return config_from_dict({"model": {"preset": "qwen3-next-80b-a3b", "recompute": "none",
                                       **model},
                             "pipeline": {"pp": 1, "microbatches": 4},
                             "hardware": {"preset": "h100-80gb"}})


@pytest.mark.parametrize("model", [dict(tp=2), dict(tp=2, ep=8), dict(cp=2)])
def test_an_mtp_depth_waits_for_its_attention_and_moe_layers_collectives(model) -> None:
    """Its exposed communication is an attention layer's plus a MoE block's (their
    sequence-parallel gathers and scatters, the dispatcher's, the all-to-alls, context
    parallelism's), its own pass through the embedding and the head, as theirs wait, and
    its projection's; it was the MoE block's alone."""
    c = _cfg(**model)
    job = build_job(c)
    assert job is not None
    got = model_costs(c)
    alone = compute_costs(job, accelerator(c.hardware))
    kinds = got.kinds

    def waits(i: int) -> tuple[float, float]:
        return (got.layers[i].forward_ms - alone.layers[i].forward_ms,
                got.layers[i].backward_ms - alone.layers[i].backward_ms)

    mtp, att, moe = kinds.index("mtp"), kinds.index("attention"), kinds.index("moe-mlp")
    edges = _edge_waits(got, alone, job)
    for side in (0, 1):
        assert waits(mtp)[side] == pytest.approx(waits(att)[side] + waits(moe)[side]
                                                 + edges[side])
    assert waits(att)[0] > 0


def _edge_waits(got, alone, job) -> tuple[float, float]:
    """(forward, backward) the embedding and the head wait for beyond their compute, and
    an MTP depth's projection (mtp_tp)."""
    proj = eh_proj_collectives(job, per_rank_arch(job.arch), job.accelerator, False)
    return tuple(sum(getattr(g, side) - getattr(a, side) for g, a in (
        (got.head, alone.head), (got.embedding, alone.embedding)))
        + sum(c.exposed_ms for c in getattr(proj, direction))
        for side, direction in (("forward_ms", "forward"), ("backward_ms", "backward")))


def test_the_offload_modules_move_an_mtp_depths_attention_and_moe_tensors() -> None:
    """What core_attn, attn_proj and expert_fc1 move off the MTP piece is what they move
    off an attention layer and a MoE block; it was the MoE block's alone."""
    acc = accelerator(_cfg().hardware)
    off = ("core_attn", "attn_proj", "expert_fc1")
    pc = PolicyCosts(arch=NEXT, acc=acc)
    moved = pc.offloaded((), off).moved
    want = sum(kind_effect(NEXT, k, (), off).offloaded_bytes for k in ("attention", "moe-mlp"))
    assert moved[-1] - moved[-2] == want
    assert kind_effect(NEXT, "attention", (), off).offloaded_bytes > 0


def test_a_transformer_mtp_depth_is_still_its_last_layers_kind() -> None:
    """DeepSeek-V3's MTP module runs one MoE decoder layer: its collectives are a MoE
    layer's, the embedding's, the head's and its projection's."""
    c = config_from_dict({"model": {"preset": "deepseek-v3", "num_layers": 4,
                                    "layers": "dense*3, moe", "tp": 2, "recompute": "none"},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    job = build_job(c)
    assert job is not None
    got, alone = model_costs(c), compute_costs(job, accelerator(c.hardware))
    mtp, moe = got.kinds.index("mtp"), got.kinds.index("moe")
    edges = _edge_waits(got, alone, job)
    for i, side in enumerate(("forward_ms", "backward_ms")):
        own = getattr(got.layers[mtp], side) - getattr(alone.layers[mtp], side)
        assert own == pytest.approx(
            getattr(got.layers[moe], side) - getattr(alone.layers[moe], side) + edges[i])
