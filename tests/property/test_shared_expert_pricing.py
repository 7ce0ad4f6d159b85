"""A shared-expert MLP of width w is priced as `shared_experts = w / moe_ffn_hidden_size`
when that divides (time, weights, gradients, optimizer state, activations, FLOPs), and
every piece of a MoE layer grows with the width."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.model import parse_model
from ppsim.config.schema import config_from_dict
from ppsim.costs.arch import Architecture
from ppsim.costs.modules import RECOMPUTE_MODULES
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.flops import iteration_flops

BASE = parse_model({"preset": "qwen3-30b-a3b", "num_layers": 2}).arch  # type: ignore[union-attr]
ACC = accelerator(config_from_dict({"model": {"preset": "llama3-8b"},
                                     "hardware": {"preset": "h100-80gb"}}).hardware)
recompute = st.lists(st.sampled_from(RECOMPUTE_MODULES), max_size=3, unique=True).map(tuple)


@st.composite
def moe_archs(draw) -> Architecture:
    tp = draw(st.sampled_from([1, 2, 4]))
    return replace(BASE, tp=tp, hidden_size=draw(st.sampled_from([512, 1024, 2048])),
                   moe_ffn_hidden_size=tp * draw(st.integers(16, 512)),
                   gated_mlp=draw(st.booleans()), shared_expert_gate=draw(st.booleans()),
                   dtype=draw(st.sampled_from(["bf16", "fp32"])),
                   seq_length=draw(st.sampled_from([512, 4096])),
                   optimizer=draw(st.sampled_from(["adam", "muon"])),
                   distributed_optimizer=draw(st.booleans()), dp=2)


@settings(max_examples=60, deadline=None)
@given(a=moe_archs(), k=st.integers(1, 8), modules=recompute)
def test_a_width_of_k_experts_prices_as_k_shared_experts(a: Architecture, k: int,
                                                         modules: tuple[str, ...]) -> None:
    count = replace(a, shared_experts=k)
    width = replace(a, shared_expert_ffn_hidden_size=k * a.moe_ffn_hidden_size)
    assert transformer_costs(width, ACC, modules) == transformer_costs(count, ACC, modules)
    assert iteration_flops(width, 64) == iteration_flops(count, 64)


@settings(max_examples=60, deadline=None)
@given(a=moe_archs(), hidden=st.sampled_from([2048, 4096]), units=st.integers(128, 1024),
       times=st.integers(2, 4))
def test_a_wider_shared_expert_costs_more_of_everything(a: Architecture, hidden: int,
                                                        units: int, times: int) -> None:
    """At a real model's shapes (a tiny matmul takes the kernel floor whatever its width;
    a slightly wider one may run at a higher efficiency on the device's curve)."""
    a = replace(a, hidden_size=hidden, seq_length=4096)
    narrow = replace(a, shared_expert_ffn_hidden_size=a.tp * units)
    wide = replace(a, shared_expert_ffn_hidden_size=a.tp * units * times)
    lo, hi = (transformer_costs(x, ACC).layers[0] for x in (narrow, wide))
    assert lo.forward_ms < hi.forward_ms and lo.backward_ms < hi.backward_ms
    assert lo.static_bytes < hi.static_bytes and lo.params < hi.params
    assert lo.activation_bytes < hi.activation_bytes
    assert lo.expert_params == hi.expert_params  # not routed: reduced over dp, not edp
    assert iteration_flops(narrow, 8) < iteration_flops(wide, 8)
