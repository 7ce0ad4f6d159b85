"""A gated MLP's SiLU output is kept by torchtitan's eager SwiGLU alone (fsdp jobs), never
by Megatron's fused one: past the inputs torchtitan's tensor parallelism keeps gathered
(ppsim.costs.saved.gathered), the two layers differ by exactly tokens x ffn x dtype bytes
/ tp."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.arch import Architecture
from ppsim.costs.modules import kept_tensors
from ppsim.costs.saved import gathered

BYTES = {"bf16": 2, "fp32": 4}


@settings(max_examples=80, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), ffn=st.sampled_from([256, 1024, 14336]),
       seq=st.sampled_from([128, 4096]), mbs=st.integers(1, 4),
       dtype=st.sampled_from(sorted(BYTES)), gated=st.booleans(),
       recompute=st.sampled_from([(), ("core_attn",), ("mlp",)]))
def test_only_the_eager_swiglu_keeps_its_silu(tp, ffn, seq, mbs, dtype, gated,
                                               recompute) -> None:
    base = dict(num_layers=4, hidden_size=1024, num_heads=16, num_kv_heads=8,
                ffn_hidden_size=ffn, vocab_size=32000, seq_length=seq, micro_batch_size=mbs,
                gated_mlp=gated, dtype=dtype, tp=tp)
    titan_arch = Architecture(**base, fsdp=True)
    whole = gathered(titan_arch)  # torchtitan's gathered inputs: none at tp 1

    def kept(a: Architecture) -> float:
        return sum(v for k, v in kept_tensors(a, "dense", recompute).items()
                   if not k.startswith(whole))

    megatron, titan = kept(Architecture(**base)), kept(titan_arch)
    silu = seq * mbs * ffn * BYTES[dtype] / tp
    expected = silu if gated and "mlp" not in recompute else 0
    assert titan - megatron == expected
