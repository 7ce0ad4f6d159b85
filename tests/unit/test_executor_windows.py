"""The executor's sliding-window attention (Megatron's --window-size W,0): each query
attends to itself and at most W keys before it, on the layers --window-attn-skip-freq
picks, in both shipped builders."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ppsim.config.presets import MODEL_PRESETS  # noqa: E402
from ppsim.errors import UserError  # noqa: E402
from ppsim.executor.builders.gpt import build  # noqa: E402
from ppsim.executor.builders.stage import AttentionCore, Stage, saved_bytes  # noqa: E402


def _attend_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    window: int) -> torch.Tensor:
    """Query by query: a softmax over the keys max(0, i - window) .. i, K/V heads shared
    by consecutive query heads."""
    heads, kv_heads, d = q.shape[1], k.shape[1], q.shape[3]
    out = torch.empty_like(q)
    for h in range(heads):
        kh, vh = k[:, h // (heads // kv_heads)], v[:, h // (heads // kv_heads)]
        for i in range(q.shape[2]):
            lo = max(0, i - window)
            scores = q[:, h, i : i + 1] @ kh[:, lo : i + 1].transpose(-1, -2) / d ** 0.5
            out[:, h, i] = (scores.softmax(-1) @ vh[:, lo : i + 1])[:, 0]
    return out


@settings(max_examples=25, deadline=None)
@given(length=st.integers(2, 24), window=st.integers(1, 30), gqa=st.booleans(),
       seed=st.integers(0, 2**16))
def test_a_windowed_core_attends_to_the_window_alone(length: int, window: int, gqa: bool,
                                                      seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, length, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2 if gqa else 4, length, 8, generator=g, dtype=torch.float64)
            for _ in range(2))
    got = AttentionCore(window)(q, k, v)
    torch.testing.assert_close(got, _attend_by_hand(q, k, v, window))


def _fields(base: str, **more) -> dict:
    return {**MODEL_PRESETS[base], "seq_length": 32, "micro_batch_size": 1, **more}


LLAMA = dict(norm="rmsnorm", position="rotary", gated_mlp=True, num_kv_heads=2)
MOE = dict(LLAMA, layers="dense, moe, dense, moe, dense, moe, dense, moe", num_experts=4,
           top_k=2, moe_ffn_hidden_size=32)


@pytest.mark.parametrize("shape", [{}, LLAMA, MOE], ids=["gpt", "llama", "moe"])
def test_a_token_reaches_no_further_than_the_windows_let_it(shape: dict) -> None:
    """Every layer windowed to 3 keys: 8 layers carry token 0 to position 24 at most, so
    changing it changes the logits up to there and none beyond (the MoE's grouped matmuls
    regroup tokens 0 to 24 and so round the others at 1e-16)."""
    b = build(_fields("tiny-gpt", attention_window=3, **shape))
    stage = Stage(b, 0, b.num_layers, True, True).double()
    ids, _ = b.microbatch(0, 0, 0)
    other = ids.clone()
    other[:, 0] = (ids[:, 0] + 1) % MODEL_PRESETS["tiny-gpt"]["vocab_size"]
    with torch.no_grad():
        moved = (stage(ids) - stage(other)).abs().amax(dim=(0, 2))
    assert moved[: 3 * 8 + 1].min() > 1e-12 and moved[3 * 8 + 1 :].max() < 1e-14


def test_skip_freq_leaves_every_other_layer_full_and_names_the_kinds() -> None:
    """Megatron numbers layers from 1: "2" leaves layers 2, 4, ... full. A profile times
    each kind apart, so windowed layers are a kind of their own."""
    for shape, kinds in (({}, ["dense+window", "dense"] * 4),
                         (MOE, ["dense+window", "moe"] * 4),
                         (dict(MOE, layers="dense*4, moe*4"),
                          ["dense+window", "dense"] * 2 + ["moe+window", "moe"] * 2)):
        b = build(_fields("tiny-gpt", attention_window=3, window_attn_skip_freq="2", **shape))
        assert [b.layer_kind(i) for i in range(b.num_layers)] == kinds
        windows = [getattr(b.layer(i), "attention", None) for i in range(b.num_layers)]
        cores = [w.core if hasattr(w, "core") else w for w in windows]
        assert [c.window for c in cores] == [3, 0] * 4


def test_the_mask_is_a_constant_not_a_kept_activation() -> None:
    """What a windowed layer keeps for its backward is what a full one keeps: the mask is
    made once and left out, as FlashAttention takes the window as two integers."""
    kept = {}
    for window in (0, 3):
        b = build(_fields("tiny-gpt", attention_window=window))
        layer = b.layer(0).double()
        x = torch.randn(1, 32, MODEL_PRESETS["tiny-gpt"]["hidden_size"], dtype=torch.float64,
                        requires_grad=True)
        params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        with saved_bytes(params) as seen:
            layer(x).sum()
        kept[window] = sum(seen.values())
    assert kept[3] == kept[0] > 0


def test_latent_attention_takes_no_window() -> None:
    with pytest.raises(UserError) as e:
        build(_fields("tiny-gpt", attention_window=3, norm="rmsnorm", position="rotary",
                      attention="mla", q_lora_rank=32, kv_lora_rank=24, qk_rope_head_dim=8,
                      head_dim=16, v_head_dim=12))
    assert e.value.field == "model.attention_window"
