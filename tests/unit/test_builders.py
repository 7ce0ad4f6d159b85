"""The shipped builders are the model the cost model describes (bytes autograd keeps).

Counted with the executor's own saved-tensor accounting (ppsim.executor.builders.stage
.saved_bytes, what the runtime records) on CPU, one decoder layer at a time,
against ppsim.layerops' analytic activation bytes for the same Architecture.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ppsim.config.schema import load_config  # noqa: E402
from ppsim.costs.transformer import layer_activation_bytes  # noqa: E402
from ppsim.executor.builders import DEFAULT_BUILDER, load_builder  # noqa: E402
from ppsim.executor.builders.llama import RMSNorm, _RMSNormFn, architecture  # noqa: E402
from ppsim.executor.builders.stage import Stage, saved_bytes  # noqa: E402

FIELDS = load_config(None).model.fields()
LLAMA = {**FIELDS, "gated_mlp": True, "norm": "rmsnorm", "position": "rotary",
         "num_kv_heads": 2, "ffn_hidden_size": 176, "layers": "dense, moe*7",
         "num_experts": 4, "top_k": 2, "moe_ffn_hidden_size": 48, "shared_experts": 1}


def _kept(fields: dict, index: int, recompute: str) -> tuple[int, int]:
    """(measured, analytic) bytes one microbatch keeps in decoder layer `index`."""
    b = load_builder(DEFAULT_BUILDER, fields)
    stage = Stage(b, index, 1, False, False, recompute=recompute).to(b.dtype)
    x = torch.randn(b.activation_shape, dtype=b.dtype, requires_grad=True)
    static = {t.untyped_storage().data_ptr() for t in [*stage.parameters(), *stage.buffers()]}
    with saved_bytes(static) as seen:
        stage(x)
    kind = getattr(b, "layer_kind", lambda i: "dense")(index)
    return sum(seen.values()), layer_activation_bytes(
        architecture({**fields, "recompute": recompute}), kind)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_dense_layers_keep_what_the_cost_model_counts(model: str, dtype: str) -> None:
    # "selective" is what FlashAttention keeps (no s x s scores); the analytic "none"
    # describes unfused attention, which the executor never runs.
    fields = {**(FIELDS if model == "gpt" else LLAMA), "dtype": dtype}
    got, want = _kept(fields, 0, "selective")
    assert abs(got - want) <= 0.02 * want, (got, want)
    got, want = _kept(fields, 0, "full")
    assert got == want


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_moe_layers_keep_about_what_the_cost_model_counts(dtype: str) -> None:
    """Within 10 %: the dropless dispatch pads every expert to the busiest one's count."""
    got, want = _kept({**LLAMA, "dtype": dtype}, 1, "selective")
    assert abs(got - want) <= 0.10 * want, (got, want)


def test_rmsnorm_keeps_input_and_statistics_and_is_exact() -> None:
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFn.apply(x, w, 1e-5), (x, w))
    torch.testing.assert_close(_RMSNormFn.apply(x, w, 1e-5),
                               torch.nn.functional.rms_norm(x, (8,), w, 1e-5))
    norm = RMSNorm(8).to(torch.bfloat16)
    xb = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    with saved_bytes({norm.weight.untyped_storage().data_ptr()}) as seen:
        norm(xb)
    assert sum(seen.values()) == xb.numel() * 2 + 4 * 4  # the input, fp32 1/rms per row


def test_the_fused_swiglu_keeps_its_inputs_alone_and_matches_the_eager_one() -> None:
    """Megatron's bias_swiglu_impl keeps only its input and recomputes the SiLU in the
    backward; the eager form (torchtitan's) keeps the SiLU output too."""
    from ppsim.executor.builders.common import swiglu

    g = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda g, u: swiglu(g, u, False), (g, u))
    torch.testing.assert_close(swiglu(g, u, False), swiglu(g, u, True))
    gb = torch.randn(4, 6, dtype=torch.bfloat16, requires_grad=True)
    ub = torch.randn(4, 6, dtype=torch.bfloat16, requires_grad=True)
    for keep, tensors in ((False, 2), (True, 3)):
        with saved_bytes(set()) as seen:
            swiglu(gb, ub, keep)
        assert sum(seen.values()) == tensors * gb.numel() * 2


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_a_torchtitan_job_keeps_the_silu_output_a_megatron_job_does_not(model: str) -> None:
    """Before: every gated MLP was counted with the eager SwiGLU's SiLU output, which
    Megatron's default fused SwiGLU does not keep (tokens x ffn x 2 bytes a layer)."""
    fields = {**(FIELDS if model == "gpt" else LLAMA), "dtype": "bf16", "gated_mlp": True}
    megatron, _ = _kept(fields, 0, "selective")
    titan, want = _kept({**fields, "fsdp": True}, 0, "selective")
    tokens = fields["seq_length"] * fields.get("micro_batch_size", 1)
    assert titan - megatron == tokens * fields["ffn_hidden_size"] * 2
    assert abs(titan - want) <= 0.02 * want, (titan, want)
