"""The executor's plain-torch hybrid layers keep for the backward what ppsim.costs.mixers
counts, less and plus the tensors docs/model.md names per kind (the fused kernels keep a
few the reference recomputes under its checkpoints)."""

from __future__ import annotations

import pytest
from helpers import kept_under_policy

torch = pytest.importorskip("torch")

from ppsim.config.model import parse_model  # noqa: E402
from ppsim.costs.kinds import kind_activation_bytes, kind_effect  # noqa: E402
from ppsim.costs.mixers import GDN_CHUNK, delta_shape, mamba_shape  # noqa: E402
from ppsim.policy.model import StagePolicy  # noqa: E402

TINY = parse_model({"preset": "tiny-hybrid"}).fields()
"""Pattern M-*-G-E-: Mamba-2, MLP, attention, MLP, GatedDeltaNet, MLP, MoE, MLP."""
FP32 = 4


def _kept(fields: dict, index: int) -> int:
    """Bytes layer `index` keeps for its backward: saved tensors and checkpoint inputs,
    parameters left out (as test_executor_policy measures the transformer layers)."""
    return kept_under_policy(fields, index, StagePolicy())[0]


def _tokens(fields: dict) -> int:
    return fields["seq_length"] * fields["micro_batch_size"]


@pytest.mark.parametrize("seq_length", [64, 256])
def test_mamba_keeps_the_cost_models_bytes(seq_length: int) -> None:
    # As mamba_ssm's fused kernel: in_proj's output and the scan's output kept, the conv and
    # the chunk states recomputed; the reference recomputes the norm's rstd too (4 B a group).
    fields = {**TINY, "seq_length": seq_length}
    arch = parse_model({"preset": "tiny-hybrid", "seq_length": seq_length}).arch  # type: ignore[union-attr]
    want = kind_activation_bytes(arch, "mamba") - _tokens(fields) * mamba_shape(arch).groups * FP32
    assert _kept(fields, 0) == want


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


# ------------------------------------------------------------------ memory policies

ARCH = parse_model({"preset": "tiny-hybrid"}).arch  # type: ignore[union-attr]


ALL_OFF = 1.0
HYBRID_CASES = [
    (2, "attention", StagePolicy(recompute_modules=("core_attn",))),
    (2, "attention", StagePolicy(offload_modules=("attn_norm", "qkv_linear", "attn_proj"),
                                 offload_fraction=ALL_OFF)),
    (2, "attention", StagePolicy(recompute_modules=("layernorm",),
                                 offload_modules=("core_attn",), offload_fraction=ALL_OFF)),
    (1, "mlp", StagePolicy(recompute_modules=("mlp",))),
    (6, "moe-mlp", StagePolicy(recompute_modules=("layernorm",))),
    (6, "moe-mlp", StagePolicy(recompute_modules=("layernorm",), offload_modules=("mlp_norm",),
                               offload_fraction=ALL_OFF)),
    (6, "moe-mlp", StagePolicy(recompute_modules=("moe_act",))),
    (6, "moe-mlp", StagePolicy(recompute_modules=("moe",))),
    (6, "moe-mlp", StagePolicy(offload_modules=("expert_fc1", "moe_act"),
                               offload_fraction=ALL_OFF)),
]


@pytest.mark.parametrize(("index", "kind", "policy"), HYBRID_CASES,
                         ids=lambda x: x.label() if isinstance(x, StagePolicy) else str(x))
def test_a_policy_on_a_hybrid_layer_keeps_the_cost_models_bytes(index: int, kind: str,
                                                                policy: StagePolicy) -> None:
    """Attention, MLP and MoE layers of a hybrid stack act on their modules as the half
    of a decoder layer each is: what the executor keeps and offloads under the policy is
    what ppsim.costs.modules counts for the kind."""
    kept, moved = kept_under_policy(TINY, index, policy)
    want = kind_effect(ARCH, kind, policy.recompute_modules, policy.offload_modules)
    assert want.kept_bytes < kind_activation_bytes(ARCH, kind) or want.offloaded_bytes
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)
    assert abs(moved - want.offloaded_bytes) <= 0.02 * max(want.offloaded_bytes, 1), (
        moved, want)


@pytest.mark.parametrize("index", [0, 4])
def test_mamba_and_gdn_layers_have_no_modules(index: int) -> None:
    policy = StagePolicy(recompute_modules=("core_attn", "layernorm", "mlp"),
                         offload_modules=("attn_norm", "mlp_norm"), offload_fraction=ALL_OFF)
    assert kept_under_policy(TINY, index, policy) == kept_under_policy(TINY, index, StagePolicy())
    kind = ("mamba", "gdn")[index // 4]
    assert kind_effect(ARCH, kind, policy.recompute_modules, policy.offload_modules) == \
        kind_effect(ARCH, kind)
