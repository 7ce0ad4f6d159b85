"""The executor runs a memory policy: the same losses and gradients as without one, and
the bytes it keeps (and offloads) per module set are the cost model's."""

from __future__ import annotations

import gc
import sys
import types
import weakref

import pytest
from helpers import kept_under_policy

torch = pytest.importorskip("torch")

from ppsim.config.model import parse_model  # noqa: E402
from ppsim.config.schema import load_config  # noqa: E402
from ppsim.costs.modules import module_effect  # noqa: E402
from ppsim.executor.builders import DEFAULT_BUILDER, load_builder  # noqa: E402
from ppsim.executor.builders import policy as executor_policy  # noqa: E402
from ppsim.executor.builders.llama import architecture  # noqa: E402
from ppsim.executor.builders.stage import Stage, full_model  # noqa: E402
from ppsim.executor.runtime import Runtime  # noqa: E402
from ppsim.policy.model import StagePolicy  # noqa: E402

GPT = load_config(None).model.fields()
LLAMA = {**GPT, "gated_mlp": True, "norm": "rmsnorm", "position": "rotary",
         "num_kv_heads": 2, "ffn_hidden_size": 176, "layers": "dense*2, moe*6",
         "num_experts": 4, "top_k": 2, "moe_ffn_hidden_size": 48, "shared_experts": 1}
OFFLOAD = ("attn_norm", "qkv_linear", "attn_proj", "mlp_norm")
HYBRID = parse_model({"preset": "tiny-hybrid"}).fields()
"""Mamba-2, GatedDeltaNet, attention, MLP and MoE layers (their halves' modules)."""


def _loss_and_grads(fields: dict, policy: StagePolicy | None) -> tuple[float, list]:
    b = load_builder(DEFAULT_BUILDER, fields)
    model = full_model(b).to(b.dtype)
    if policy is not None:
        executor_policy.apply_policy(model.layers, policy)
    ids, targets = b.microbatch(0, 0, 0)
    loss = b.loss(model(ids), targets)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(("fields", "policy"), [
    (GPT, StagePolicy(recompute_modules=("core_attn",), recompute_layers=3,
                      offload_modules=OFFLOAD + ("core_attn",), offload_fraction=1.0)),
    (LLAMA, StagePolicy(recompute_modules=("core_attn", "mlp", "moe"), recompute_layers=1,
                        offload_modules=OFFLOAD, offload_fraction=0.5)),
    (LLAMA, StagePolicy(recompute_modules=("shared_experts",),
                        offload_modules=("core_attn", "expert_fc1"), offload_fraction=1.0)),
    (GPT, StagePolicy(recompute_modules=("layernorm", "mlp"),
                      offload_modules=("attn_norm", "qkv_linear"), offload_fraction=1.0)),
    (LLAMA, StagePolicy(recompute_modules=("layernorm", "moe_act"),
                        offload_modules=("attn_norm", "qkv_linear", "moe_act"),
                        offload_fraction=1.0)),
    (LLAMA, StagePolicy(recompute_modules=("moe_act", "core_attn"), recompute_layers=1,
                        offload_modules=("moe_act", "expert_fc1"), offload_fraction=1.0)),
    (HYBRID, StagePolicy(recompute_modules=("core_attn", "mlp", "moe_act", "layernorm"),
                         offload_modules=("qkv_linear", "expert_fc1"), offload_fraction=1.0)),
], ids=["gpt", "llama-moe", "llama-shared", "gpt-layernorm", "llama-discarding",
        "llama-moe_act", "hybrid"])
def test_a_policy_leaves_losses_and_gradients_unchanged(fields: dict, policy) -> None:
    want_loss, want = _loss_and_grads(fields, None)
    executor_policy.offloaded[0] = 0
    got_loss, got = _loss_and_grads(fields, policy)
    assert executor_policy.offloaded[0] > 0  # the host path ran
    assert got_loss == want_loss
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


CASES = [
    StagePolicy(),
    StagePolicy(offload_modules=("attn_proj",), offload_fraction=1.0),
    StagePolicy(recompute_modules=("core_attn",)),
    StagePolicy(recompute_modules=("layernorm",)),
    StagePolicy(recompute_modules=("layernorm", "core_attn"), offload_modules=(
        "attn_norm", "qkv_linear", "mlp_norm"), offload_fraction=1.0),
    StagePolicy(recompute_layers=1),
    StagePolicy(offload_modules=("core_attn", "attn_proj"), offload_fraction=1.0),
    StagePolicy(offload_modules=("attn_norm", "mlp_norm", "qkv_linear"), offload_fraction=1.0),
]


@pytest.mark.parametrize("policy", CASES + [StagePolicy(recompute_modules=("mlp",))],
                         ids=lambda p: p.label())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dense_bytes_per_module_set_are_the_cost_models(policy, dtype: str) -> None:
    fields = {**LLAMA, "dtype": dtype, "layers": "dense*8"}
    kept, moved = kept_under_policy(fields, 0, policy)
    want = module_effect(architecture(fields), "dense", policy.recompute_modules,
                         policy.offload_modules, full=policy.recompute_layers > 0)
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)
    assert abs(moved - want.offloaded_bytes) <= 0.02 * max(want.offloaded_bytes, 1), (
        moved, want)


@pytest.mark.parametrize("policy", CASES + [
    StagePolicy(recompute_modules=("moe",)), StagePolicy(recompute_modules=("shared_experts",)),
    StagePolicy(offload_modules=("expert_fc1",), offload_fraction=1.0),
    StagePolicy(recompute_modules=("moe_act",)),
    StagePolicy(offload_modules=("moe_act",), offload_fraction=1.0),
    StagePolicy(recompute_modules=("moe_act", "layernorm"), offload_modules=("moe_act",),
                offload_fraction=1.0),
    StagePolicy(recompute_modules=("moe", "moe_act")),
    StagePolicy(recompute_modules=("shared_experts",), offload_modules=("expert_fc1", "mlp_norm"),
                offload_fraction=1.0)], ids=lambda p: p.label())
def test_moe_bytes_per_module_set_are_the_cost_models(policy) -> None:
    """The dropless grouped GEMM keeps each (token, slot) pair once, as the model counts
    it (an expert padded to the busiest one's count would keep more)."""
    fields = {**LLAMA, "dtype": "bf16"}
    kept, moved = kept_under_policy(fields, 2, policy)
    want = module_effect(architecture(fields), "moe", policy.recompute_modules,
                         policy.offload_modules, full=policy.recompute_layers > 0)
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)
    assert abs(moved - want.offloaded_bytes) <= 0.02 * max(want.offloaded_bytes, 1)


@pytest.mark.parametrize("policy", CASES + [StagePolicy(recompute_modules=("mlp",)),
                                    StagePolicy(recompute_modules=("mlp", "layernorm"))],
                         ids=lambda p: p.label())
def test_gpt_bytes_per_module_set_are_the_cost_models(policy) -> None:
    """The default builder's block (LayerNorm, learned positions, GELU MLP inline): its
    MLP is a piece a policy checkpoints as the Llama layer's MLP module."""
    kept, moved = kept_under_policy(GPT, 0, policy)
    want = module_effect(architecture(GPT), "dense", policy.recompute_modules,
                         policy.offload_modules, full=policy.recompute_layers > 0)
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)
    assert abs(moved - want.offloaded_bytes) <= 0.02 * max(want.offloaded_bytes, 1)


MLA = {**LLAMA, "attention": "mla", "q_lora_rank": 32, "kv_lora_rank": 24,
       "qk_rope_head_dim": 8, "head_dim": 16, "v_head_dim": 12}
MLA_CASES = CASES + [
    StagePolicy(recompute_modules=("mla_up_proj",)),
    StagePolicy(recompute_modules=("mla_up_proj", "core_attn", "layernorm")),
    StagePolicy(offload_modules=("qkv_linear", "core_attn", "attn_proj"), offload_fraction=1.0),
    StagePolicy(recompute_modules=("mla_up_proj",), offload_modules=("core_attn", "qkv_linear"),
                offload_fraction=1.0),
    StagePolicy(offload_modules=("core_attn",), offload_fraction=1.0),
]


@pytest.mark.parametrize("policy", MLA_CASES, ids=lambda p: p.label())
@pytest.mark.parametrize(("kind", "q_lora_rank", "normed"),
                         [("dense", 32, False), ("moe", 32, False), ("dense", 0, False),
                          ("dense", 32, True)])
def test_mla_bytes_per_module_set_are_the_cost_models(policy, kind: str, q_lora_rank: int,
                                                      normed: bool) -> None:
    """Latents (normed with qk_layernorm, Megatron's --qk-layernorm), the up projection
    (Megatron's mla_up_proj) and attention with value heads narrower than key heads keep
    what the model counts: no s x s scores, no padded value."""
    fields = {**MLA, "dtype": "bf16", "q_lora_rank": q_lora_rank, "qk_layernorm": normed}
    kept, moved = kept_under_policy(fields, 0 if kind == "dense" else 2, policy)
    want = module_effect(architecture(fields), kind, policy.recompute_modules,
                         policy.offload_modules, full=policy.recompute_layers > 0)
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)
    assert abs(moved - want.offloaded_bytes) <= 0.02 * max(want.offloaded_bytes, 1)


@pytest.mark.parametrize("policy", [
    StagePolicy(recompute_modules=("mla_up_proj",)),
    StagePolicy(recompute_modules=("mla_up_proj", "layernorm", "moe_act"),
                offload_modules=("qkv_linear", "core_attn"), offload_fraction=1.0),
    StagePolicy(recompute_modules=("core_attn",), recompute_layers=1,
                offload_modules=("attn_proj", "expert_fc1"), offload_fraction=1.0),
], ids=lambda p: p.label())
def test_an_mla_policy_leaves_losses_and_gradients_unchanged(policy) -> None:
    want_loss, want = _loss_and_grads(MLA, None)
    got_loss, got = _loss_and_grads(MLA, policy)
    assert got_loss == want_loss
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_mla_attention_is_exact_attention() -> None:
    """The padded fused kernel against softmax(QK^T / sqrt(d))V in float64, values and
    gradients."""
    from ppsim.executor.builders.mla import LatentAttentionCore

    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 48, 4, 24, generator=gen).transpose(1, 2).requires_grad_()
            for _ in range(2))
    v = torch.randn(2, 48, 4, 16, generator=gen).transpose(1, 2).requires_grad_()
    out = LatentAttentionCore()(q, k, v)
    grad = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v), grad)
    scores = q.double() @ k.double().transpose(-1, -2) / 24 ** 0.5
    mask = torch.ones(48, 48, dtype=torch.bool).triu(1)
    ref = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v.double()
    want = torch.autograd.grad(ref, (q, k, v), grad.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-4, atol=1e-5)


WRAPPED = '''
from torch import nn
from ppsim.executor.builders import gpt


class Wrapped(nn.Module):
    """A user's layer around the shipped block: its AttentionCore is found, nothing else."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class Builder(gpt.GPTBuilder):
    def layer(self, index):
        return Wrapped(super().layer(index))


def build(fields):
    return Builder(gpt.GPTShape.from_fields(fields))
'''


def test_a_policy_naming_modules_a_users_layers_lack_is_refused(tmp_path, capsys) -> None:
    """Those modules would run as if not named while the simulation frees their tensors."""
    from ppsim.cli.main import main

    path = tmp_path / "wrapped.py"
    path.write_text(WRAPPED)
    argv = ["run", "--model", f"{path}:build", "--iterations", "1"]
    assert main([*argv, "--recompute-modules", "layernorm,core_attn",
                 "--fine-grained-activation-offloading", "--offload-modules", "attn_norm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "memory" in err[-1] and "layernorm, attn_norm" in err[-1] and len(err) <= 2
    b = load_builder(f"{path}:build", GPT)
    layer = b.layer(0)
    assert executor_policy.unsupported(layer, StagePolicy(recompute_modules=("core_attn",))) == ()
    with pytest.raises(ValueError, match="Wrapped layers have no piece for mlp"):
        executor_policy.apply_policy(torch.nn.ModuleDict({"0": layer}),
                                     StagePolicy(recompute_modules=("mlp",)))


class _Link:
    """One object of a reference cycle (weakly referenceable, unlike a frame)."""

    frame: object
    itself: object


def _cycle_below(module: torch.nn.Module, made: list) -> None:
    """Make `module`'s forward leave a reference cycle through its own frame, as torch
    2.11's first checkpoint call on CUDA does through the imports it runs: until a full
    collection, that frame keeps its callers' frames (f_back) and their locals."""
    inner = module.forward

    def forward(*args: object) -> object:
        node = _Link()
        node.frame, node.itself = sys._getframe(), node
        made.append(weakref.ref(node))
        return inner(*args)

    module.forward = forward


def test_a_cycle_under_the_last_stage_keeps_no_logits() -> None:
    """The last stage's logits go from the head straight into the loss: a reference
    cycle in a layer's forward (the ~220 MB a checkpointed last stage kept on the H200)
    holds no caller's frame that binds them."""
    b = load_builder(DEFAULT_BUILDER, GPT)
    stage = Stage(b, 0, 2, True, True).to(b.dtype)
    made: list = []
    _cycle_below(stage.layers["0"], made)
    logits: list = []
    stage.head.register_forward_hook(
        lambda m, i, o: logits.append(o.untyped_storage()._weak_ref()))
    runtime = types.SimpleNamespace(modules={0: stage}, builder=b,
                                    schedule=types.SimpleNamespace(microbatches=2))
    ids, targets = b.microbatch(0, 0, 0)
    gc.collect()
    gc.disable()
    try:
        loss = Runtime._stage_forward(runtime, 0, ids, targets)  # type: ignore[arg-type]
        assert made[0]() is not None  # the cycle is there, uncollected
        assert torch.UntypedStorage._expired(logits[0])
        loss.backward()
    finally:
        gc.enable()
        gc.collect()
