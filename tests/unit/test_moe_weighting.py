"""Where the routing probabilities weigh a MoE layer's pairs, and what that keeps.

Megatron's TEGroupedMLP multiplies each pair's activation by its probability inside the
experts (experts.py, bias_act_func: weighted_bias_swiglu_impl when the SwiGLU is fused,
else an eager product), and the dispatcher's combine_postprocess unpermutes with no
probabilities; so a pair keeps its fc1 input, fc1's output (gate and up), fc2's input and
its fp32 probability, and no expert output. torchtitan's MoE scales the experts' input or
output by the scores, keeping a hidden-wide tensor a pair.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.saved import saved_tensors
from ppsim.executor.builders.llama import LlamaShape
from ppsim.executor.builders.moe import MoE, WeightedSwiGLUFn

S, H, FFN, K = 4096, 4096, 1536, 8


def _experts_bytes(**model: object) -> float:
    a = config_from_dict({"model": {"preset": "qwen3-235b-a22b", "num_layers": 2,
                                    "seq_length": S, "micro_batch_size": 1, **model},
                          "pipeline": {"pp": 1, "microbatches": 1}}).model.arch
    return sum(v for k, v in saved_tensors(a, "moe").items() if k.startswith("experts."))


@pytest.mark.parametrize("tp, etp, ep, dp", [(1, 1, 8, 8), (2, 1, 8, 4), (2, 2, 4, 4)])
def test_megatrons_experts_keep_no_output_for_the_probabilities(tp, etp, ep, dp) -> None:
    """The defect: each pair's h-wide expert output was counted as kept for the combine's
    weighting, which Megatron does in the activation (Qwen3-235B at tp 2: 134 MB of a
    layer's 597 a microbatch)."""
    pairs = S * K  # the tp group's; a rank keeps etp / tp of them at 1 / etp of the width
    want = pairs * ((H * etp + 3 * FFN) * 2 + 4 * etp) / tp
    assert _experts_bytes(tp=tp, etp=etp, ep=ep, dp=dp) == pytest.approx(want, rel=1e-12)


def test_an_eager_product_keeps_its_unweighted_factor() -> None:
    fused = _experts_bytes(tp=1)
    eager = _experts_bytes(tp=1, bias_swiglu_fusion=False)
    assert eager - fused == pytest.approx(S * K * FFN * 2 * 2, rel=1e-12)  # SiLU and factor


def test_torchtitans_experts_keep_a_hidden_wide_tensor_a_pair() -> None:
    titan = _experts_bytes(tp=1, fsdp=True, dp=8, ep=8)
    eager = _experts_bytes(tp=1, bias_swiglu_fusion=False, dp=8, ep=8)
    # both eager SwiGLUs; torchtitan keeps h a pair where Megatron keeps ffn + fp32 probs
    assert titan - eager == pytest.approx(S * K * (H * 2 - FFN * 2 - 4), rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), width=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_the_weighted_swiglus_gradients_are_the_eager_products(rows, width, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    gate, up = (torch.randn(rows, width, generator=g, dtype=torch.float64, requires_grad=True)
                for _ in range(2))
    probs = torch.rand(rows, generator=g, dtype=torch.float64, requires_grad=True)
    out = torch.randn(rows, width, generator=g, dtype=torch.float64)
    fused = WeightedSwiGLUFn.apply(gate, up, probs)
    grads = torch.autograd.grad((fused * out).sum(), (gate, up, probs))
    eager = torch.nn.functional.silu(gate) * up * probs[:, None]
    want = torch.autograd.grad((eager * out).sum(), (gate, up, probs))
    torch.testing.assert_close(fused, eager)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("fields", [{}, {"gated_mlp": False}, {"bias_swiglu_fusion": False}])
def test_weighing_the_activation_is_weighing_the_output(fields) -> None:
    """fc2 is linear: p (act W) = (p act) W, so Megatron's order and torchtitan's give
    one layer (here in float64), gradients included."""
    base = {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "num_kv_heads": 2,
            "ffn_hidden_size": 32, "vocab_size": 64, "seq_length": 8, "layers": "moe*1",
            "num_experts": 4, "top_k": 2, "moe_ffn_hidden_size": 8, **fields}
    torch.manual_seed(0)
    inside = MoE(LlamaShape.from_fields(base)).double()
    after = MoE(LlamaShape.from_fields({**base, "fsdp": True, "dp": 2})).double()
    assert inside.probs_in_activation and not after.probs_in_activation
    for p in inside.parameters():
        torch.nn.init.normal_(p, std=0.5)
    after.load_state_dict(inside.state_dict())
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    a, b = inside(x), after(x)
    torch.testing.assert_close(a, b)
    ga = torch.autograd.grad(a.square().sum(), [x, *inside.parameters()])
    gb = torch.autograd.grad(b.square().sum(), [x, *after.parameters()])
    for u, v in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, v)
