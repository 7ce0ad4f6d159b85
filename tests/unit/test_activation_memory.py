"""Activation and static memory: the analytic bytes against what autograd really saves
(saved-tensor hooks on the executor's model, on CPU) and against Megatron's formulas."""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch

from ppsim.cli.main import main
from ppsim.config.model import model_fields
from ppsim.config.presets import MODEL_PRESETS
from ppsim.costs.transformer import Accelerator, Architecture, transformer_costs
from ppsim.costs.transformer import layer_activation_bytes as act_bytes
from ppsim.executor.builders.common import Head, stage_loss
from ppsim.executor.builders.gpt import Block, Embedding, GPTShape

ACC = Accelerator(peak_tflops=100.0)


def saved_bytes(module: torch.nn.Module, fn) -> int:
    """Bytes of the distinct storages autograd saves while `fn` runs, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def executor_arch(**kw) -> Architecture:
    """An Architecture describing the executor's model: LayerNorm, learned positions,
    no dropout, FlashAttention (scaled_dot_product_attention, causal)."""
    base = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
                vocab_size=512, seq_length=32, micro_batch_size=2, gated_mlp=False,
                dtype="fp32", norm="layernorm", position="learned", recompute="none")
    return Architecture(**{**base, **kw})


def shape_of(a: Architecture) -> GPTShape:
    return GPTShape(a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads, a.ffn_hidden_size,
                    a.vocab_size, a.seq_length, a.micro_batch_size, a.gated_mlp, a.dtype)


def expanded_kv_bytes(a: Architecture) -> int:
    """The executor's GQA repeats K and V to every query head before attention (when it
    does), so autograd keeps them at full width; FlashAttention with GQA would not."""
    if a.num_kv_heads == a.num_heads or "repeat_interleave" not in inspect.getsource(Block):
        return 0
    hd = a.hidden_size // a.num_heads
    tok = a.seq_length * a.micro_batch_size
    return 2 * tok * (a.num_heads - a.num_kv_heads) * hd * (4 if a.dtype == "fp32" else 2)


def measured_layer(a: Architecture) -> int:
    s = shape_of(a)
    torch.manual_seed(0)
    block = Block(s).to(s.torch_dtype)
    x = torch.randn(a.micro_batch_size, a.seq_length, a.hidden_size, dtype=s.torch_dtype,
                    requires_grad=True)
    return saved_bytes(block, lambda: block(x))


VARIANTS = {
    "gpt (MHA, GELU)": {},
    "gated MLP, ffn 3.5h": dict(gated_mlp=True, ffn_hidden_size=224),
    "GQA 4/2, SwiGLU": dict(gated_mlp=True, num_kv_heads=2, ffn_hidden_size=224),
    "bf16": dict(dtype="bf16"),
    "bf16 GQA 8/2, long": dict(dtype="bf16", num_heads=8, num_kv_heads=2, seq_length=128,
                               gated_mlp=True, ffn_hidden_size=176),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_layer_bytes_match_autograd(name):
    a = executor_arch(**VARIANTS[name])
    want = measured_layer(a)
    got = act_bytes(a, "dense") + expanded_kv_bytes(a)
    assert abs(got - want) <= 0.02 * want, (name, got, want)


def _scaled_preset(name: str) -> Architecture:
    """A preset's layer shape scaled down (widths / 64, heads / 8, s = 64), ratios kept."""
    f = model_fields({"preset": name})
    heads = max(2, f["num_heads"] // 8)
    group = f["num_heads"] // f["num_kv_heads"]
    kv = max(1, heads // group)
    heads = kv * min(group, heads)
    hd = 8
    return executor_arch(hidden_size=heads * hd, num_heads=heads, num_kv_heads=kv,
                         ffn_hidden_size=max(8, f["ffn_hidden_size"] // 64),
                         gated_mlp=f.get("gated_mlp", True), seq_length=64, micro_batch_size=1)


@pytest.mark.parametrize("name", [n for n, f in MODEL_PRESETS.items()
                                  if not f.get("num_experts") and f.get("attention") != "mla"])
def test_preset_layer_shapes_match_autograd(name):
    a = _scaled_preset(name)
    want = measured_layer(a)
    got = act_bytes(a, "dense") + expanded_kv_bytes(a)
    assert abs(got - want) <= 0.02 * want, (name, got, want)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_head_and_embedding_bytes_match_autograd(dtype):
    # vocab a multiple of 128: Megatron's padding is a no-op
    a = executor_arch(vocab_size=1024, dtype=dtype)
    s = shape_of(a)
    head, emb = Head(s.hidden_size, s.vocab_size).to(s.torch_dtype), Embedding(s).to(s.torch_dtype)
    x = torch.randn(a.micro_batch_size, a.seq_length, a.hidden_size, dtype=s.torch_dtype,
                    requires_grad=True)
    ids = torch.randint(0, a.vocab_size, (a.micro_batch_size, a.seq_length))
    targets = torch.randint(0, a.vocab_size, (a.micro_batch_size, a.seq_length))
    got = transformer_costs(a, ACC)
    want_head = saved_bytes(head, lambda: stage_loss(head(x), targets))
    # The loss also keeps the targets (int64) the analytic count leaves out.
    want_head -= targets.numel() * 8
    assert abs(got.head.activation_bytes - want_head) <= 0.02 * want_head
    want_emb = saved_bytes(emb, lambda: emb(ids))
    assert abs(got.embedding.activation_bytes - want_emb) <= 0.02 * want_emb + 8 * a.seq_length


def test_recompute_full_keeps_only_the_input_and_none_stores_no_scores():
    """With FlashAttention no mode stores the s x s scores: "none" keeps what
    "selective" (Megatron's core_attn recompute) keeps plus the log-sum-exp only."""
    a = executor_arch()
    full = act_bytes(executor_arch(recompute="full"), "dense")
    assert full == a.seq_length * a.micro_batch_size * a.hidden_size * 4
    none = act_bytes(executor_arch(recompute="none"), "dense")
    selective = act_bytes(executor_arch(recompute="selective"), "dense")
    assert none - selective == 4 * a.seq_length * a.micro_batch_size * a.num_heads
    assert none < selective + a.num_heads * a.seq_length ** 2  # no scores


def test_tp_divides_every_tensor():
    a = executor_arch(dtype="bf16", hidden_size=256, num_heads=8, num_kv_heads=8)
    for tp in (2, 4, 8):
        b = executor_arch(dtype="bf16", hidden_size=256, num_heads=8, num_kv_heads=8, tp=tp)
        assert abs(act_bytes(b, "dense") * tp - act_bytes(a, "dense")) <= tp


# ------------------------------------------------------------------ Megatron's formulas
# Reproduced from Megatron-LM, megatron/training/theoretical_memory_usage.py
# (compute_weight_and_optimizer_memory, compute_activation_memory): Korthikanti et
# al. 2022 Table 2 for selective recompute with sequence parallelism.


def megatron_activation_memory(s, b, h, ffn, num_layers, pp, tp, m, padded_vocab):
    act = s * b * h * (18 + 4 * (ffn / h)) * num_layers
    act += 8 * s * b * pp  # input ids, pp microbatches in flight
    act += s * b * h * pp  # embedding dropout mask
    if pp > 1:
        act *= min(1, m / pp)
    else:
        act += s * b * h * 4 * (1 + padded_vocab / h)  # output layer and loss
    return act / tp


def megatron_weight_memory(a: Architecture, pp: int, padded_vocab: int) -> float:
    h, heads = a.hidden_size, a.num_heads
    q_proj = (a.head_dim or h // heads) * heads
    gated = 3 / 2 if a.gated_mlp else 1
    layers = 2 * a.num_layers * h * h * (
        (1 + a.num_kv_heads / heads) * q_proj / h
        + (a.ffn_hidden_size / h) * gated
        + 2 / h
        + 1 / (a.num_layers * h))
    embedding = h * padded_vocab
    first = (layers / pp + embedding) / a.tp  # untied embeddings, pp > 1
    if a.learned_positions:
        # The formula leaves out the learned position table LanguageModelEmbedding builds
        # (max_position_embeddings x hidden, whole on every tensor rank).
        first += a.seq_length * h
    per_param = 18 if not a.distributed_optimizer else 6 + 12 / a.dp
    return first * per_param


MEGATRON_CHECK = 18_320_850_944  # s = h = 4096, b 1, ffn 16384, L 32, pp 4, m 8


def test_megatron_check_value_reproduced():
    got = megatron_activation_memory(4096, 1, 4096, 16384, 32, 4, 1, 8, 51200)
    assert got == MEGATRON_CHECK


def test_ppsim_first_stage_matches_megatron_check(tmp_path, capsys):
    toml = """
[model]
kind = "transformer"
num_layers = 32
hidden_size = 4096
num_heads = 32
num_kv_heads = 32
ffn_hidden_size = 16384
vocab_size = 51200
seq_length = 4096
gated_mlp = false
dropout = true
norm = "layernorm"
recompute = "selective"
[pipeline]
pp = 4
microbatches = 8
schedule = "1f1b"
split = "even"
[hardware]
preset = "h200-141gb"
"""
    p = tmp_path / "m.toml"
    p.write_text(toml)
    assert main(["simulate", "--config", str(p), "--json"]) == 0
    rank0 = json.loads(capsys.readouterr().out)["ranks"][0]
    # ppsim also counts norm statistics and FlashAttention's log-sum-exp.
    assert abs(rank0["peak_activation_bytes"] / MEGATRON_CHECK - 1) < 0.005


@pytest.mark.parametrize("kw", [
    dict(),  # GPT-like
    dict(tp=8),
    dict(gated_mlp=True, norm="rmsnorm", num_kv_heads=8, ffn_hidden_size=14336,
         vocab_size=128256),  # Llama-3-8B-like
    dict(gated_mlp=True, norm="rmsnorm", num_kv_heads=8, ffn_hidden_size=28672, tp=8,
         hidden_size=8192, num_heads=64, vocab_size=128256, num_layers=80),  # 70B-like
    dict(distributed_optimizer=True, dp=16, vocab_size=50257),  # padding matters
])
def test_static_bytes_match_megatron(kw):
    base = dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                ffn_hidden_size=16384, vocab_size=51200, seq_length=4096, gated_mlp=False,
                norm="layernorm", dtype="bf16")
    a = Architecture(**{**base, **kw})
    pp = 4
    padded = math.ceil(a.vocab_size / (128 * a.tp)) * 128 * a.tp
    c = transformer_costs(a, ACC)
    first = c.embedding.static_bytes + sum(x.static_bytes for x in c.layers[:a.num_layers // pp])
    want = megatron_weight_memory(a, pp, padded)
    assert abs(first / want - 1) < 0.005, (first, want)

