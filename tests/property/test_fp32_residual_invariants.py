"""--fp32-residual-connection's invariants on random bf16 models (dense, MoE, hybrid), any
tensor parallelism with or without sequence parallelism and any recompute mode: the
pipeline's message is twice the bf16 stream's, and no layer keeps less or runs faster."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["gpt3-1.3b", "llama3-8b", "qwen3-30b-a3b", "nemotron-h-8b"]),
       st.sampled_from([1, 2, 4]), st.booleans(), st.sampled_from(["none", "selective",
                                                                    "full"]))
def test_the_stream_in_fp32_costs_never_less(preset: str, tp: int, sp: bool,
                                             recompute: str) -> None:
    sp = sp or preset == "qwen3-30b-a3b"  # MoE at tp > 1 needs sequence parallelism
    off, on = (config_from_dict({"model": {"preset": preset, "tp": tp, "dtype": "bf16",
                                           "sequence_parallel": sp, "recompute": recompute,
                                           "fp32_residual": fp32},
                                 "hardware": {"preset": "h100-80gb"}}) for fp32 in (False, True))
    acc = accelerator(on.hardware)
    plain, wide = (transformer_costs(c.model.arch, acc) for c in (off, on))
    for p, w in zip(plain.layers, wide.layers, strict=True):
        assert w.output_bytes == 2 * p.output_bytes
        assert w.activation_bytes >= p.activation_bytes
        assert w.forward_ms >= p.forward_ms and w.backward_ms >= p.backward_ms
    assert wide.embedding.output_bytes == 2 * plain.embedding.output_bytes
    assert wide.head.activation_bytes >= plain.head.activation_bytes
