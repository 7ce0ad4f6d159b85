"""The executor's plain-torch hybrid layers keep for the backward what ppsim.costs.mixers
counts, less and plus the tensors docs/model.md names per kind (the fused kernels keep a
few the reference recomputes under its checkpoints)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ppsim.config.model import parse_model  # noqa: E402
from ppsim.costs.mixers import (  # noqa: E402
    GDN_CHUNK,
    MAMBA_CHUNK,
    delta_shape,
    kind_activation_bytes,
    mamba_shape,
)
from ppsim.executor.builders.hybrid import build  # noqa: E402
from ppsim.executor.builders.stage import Stage, saved_bytes  # noqa: E402

TINY = parse_model({"preset": "tiny-hybrid"}).fields()
"""Pattern M-*-G-E-: Mamba-2, MLP, attention, MLP, GatedDeltaNet, MLP, MoE, MLP."""
FP32 = 4


def _kept(fields: dict, index: int) -> int:
    """Bytes layer `index` keeps for its backward: saved tensors and checkpoint inputs,
    parameters left out (as test_executor_policy measures the transformer layers)."""
    b = build(fields)
    stage = Stage(b, index, 1, False, False).to(b.dtype)
    x = torch.randn(b.activation_shape, generator=torch.Generator().manual_seed(0)).to(
        b.dtype).requires_grad_()
    static = {t.untyped_storage().data_ptr() for t in [*stage.parameters(), *stage.buffers()]}
    with saved_bytes(static) as seen:
        stage(x)
    return sum(seen.values())


def _tokens(fields: dict) -> int:
    return fields["seq_length"] * fields["micro_batch_size"]


@pytest.mark.parametrize("seq_length", [64, 256])
def test_mamba_keeps_the_cost_models_bytes_but_the_chunk_states(seq_length: int) -> None:
    fields = {**TINY, "seq_length": seq_length}
    arch = parse_model({"preset": "tiny-hybrid", "seq_length": seq_length}).arch  # type: ignore[union-attr]
    m = mamba_shape(arch)
    # mamba_ssm keeps the inter-chunk states (fp32); the reference recomputes them.
    states = _tokens(fields) // MAMBA_CHUNK * m.inner * m.state * FP32
    want = kind_activation_bytes(arch, "mamba") - states
    got = _kept(fields, 0)
    assert abs(got - want) <= 0.01 * want, (got, want)


@pytest.mark.parametrize("seq_length", [64, 256])
def test_gdn_keeps_the_cost_models_bytes_but_the_chunk_matrix(seq_length: int) -> None:
    fields = {**TINY, "seq_length": seq_length}
    arch = parse_model({"preset": "tiny-hybrid", "seq_length": seq_length}).arch  # type: ignore[union-attr]
    d, tok = delta_shape(arch), _tokens(fields)
    heads, dk, dv = d.value_heads, arch.linear_key_head_dim, arch.linear_value_head_dim
    # FLA keeps each chunk's A matrix and the states (fp32); the reference recomputes them,
    # and keeps q and k repeated to the value heads where FLA keeps them per key head.
    recomputed = tok * heads * GDN_CHUNK * FP32 + tok // GDN_CHUNK * heads * dk * dv * FP32
    repeated = 2 * tok * (heads - arch.linear_num_key_heads) * dk * FP32
    want = kind_activation_bytes(arch, "gdn") - recomputed + repeated
    got = _kept(fields, 4)
    assert abs(got - want) <= 0.02 * want, (got, want)


@pytest.mark.parametrize(("index", "kind"), [(1, "mlp"), (6, "moe-mlp")])
def test_mlp_and_moe_layers_keep_the_cost_models_bytes(index: int, kind: str) -> None:
    arch = parse_model({"preset": "tiny-hybrid"}).arch  # type: ignore[union-attr]
    want = kind_activation_bytes(arch, kind)
    assert abs(_kept(TINY, index) - want) <= 0.02 * want


def test_attention_keeps_the_cost_models_bytes() -> None:
    """No copy of attention's output for the projection: it is laid out as the projection
    reads it (a copy would be 20 % of this layer)."""
    arch = parse_model({"preset": "tiny-hybrid"}).arch  # type: ignore[union-attr]
    want = kind_activation_bytes(arch, "attention")
    assert abs(_kept(TINY, 2) - want) <= 0.02 * want
