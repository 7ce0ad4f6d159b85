"""The weights Megatron keeps whole on every tensor-parallel rank: the MoE router
(TopKRouter's weight is one unsplit parameter, moe/router.py) and MLA's down projections
(the Transformer Engine spec builds them as TELinear(parallel_mode="duplicated"),
multi_latent_attention.py). ppsim split both by tp: a DeepSeek-V3 proxy's last rank at tp
2 read 0.24 GB under what those weights, their gradients and optimizer state take."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.presets import MODEL_PRESETS
from ppsim.costs.arch import Architecture
from ppsim.costs.transformer import held_params

DEEPSEEK = Architecture(**MODEL_PRESETS["deepseek-v3"])


def megatron_rank_params(a: Architecture) -> float:
    """One tp rank's non-expert weights of a DeepSeek-V3 MoE layer, restated from
    Megatron's modules: whole: the two RMSNorms, q and kv layernorms, q_down (h x
    q_lora), kv_down (h x (kv_lora + rope)), the router (experts x h); split by tp: q_up
    (q_lora x heads x (qk + rope)), kv_up (kv_lora x heads x (qk + v)), the output
    projection (heads x v x h), the shared expert's fc1 (h x 2 ffn) and fc2 (ffn x h)."""
    h, n = a.hidden_size, a.num_heads
    qk, rope, v = a.head_dim, a.qk_rope_head_dim, a.v_head_dim
    whole = (2 * h + a.q_lora_rank + a.kv_lora_rank + h * a.q_lora_rank
             + h * (a.kv_lora_rank + rope) + a.num_experts * h)
    split = (a.q_lora_rank * n * (qk + rope) + a.kv_lora_rank * n * (qk + v) + n * v * h
             + a.shared_experts * 3 * h * a.moe_ffn_hidden_size)
    return whole + split / a.tp


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8, 16]), experts=st.sampled_from([64, 128, 256]))
def test_a_rank_holds_the_router_and_the_down_projections_whole(tp: int,
                                                                  experts: int) -> None:
    a = replace(DEEPSEEK, tp=tp, num_experts=experts)
    assert held_params(a, "moe").dense == megatron_rank_params(a)


def test_the_whole_weights_are_what_a_wider_tp_no_longer_divides() -> None:
    """From tp 1 to tp 8 a rank keeps all of the router and the down projections: the
    layer's weights fall by 7/8 of the split part alone."""
    one, eight = (held_params(replace(DEEPSEEK, tp=t), "moe").dense for t in (1, 8))
    h = DEEPSEEK.hidden_size
    whole = h * (DEEPSEEK.q_lora_rank + DEEPSEEK.kv_lora_rank + DEEPSEEK.qk_rope_head_dim
                 + DEEPSEEK.num_experts) + 2 * h + DEEPSEEK.q_lora_rank \
        + DEEPSEEK.kv_lora_rank
    assert one - eight == (one - whole) * 7 / 8
