"""A Llama/Qwen-style decoder: RMSNorm, rotary embeddings, GQA, SwiGLU, optional MoE.

`build(fields)` reads the architecture fields of `[model]` and, when present,
these (defaults in brackets):

- `layers`: the kind of each decoder layer, a list (["dense", "moe", ...]) or a
  string ("dense*3, moe*5") [all dense];
- `num_experts` [4], `moe_top_k` [2], `moe_ffn_hidden_size` [ffn_hidden_size],
  `moe_shared_expert` (one always-on SwiGLU expert of that width) [False];
- `rope_theta` [10000.0], `norm_eps` [1e-5].

A MoE layer routes each token to its top-k experts (softmax router in fp32,
weights renormalised over the chosen k, no auxiliary loss) and runs the
experts as batched matmuls over an experts dimension: tokens are grouped by
expert into one (experts, capacity, hidden) tensor padded to the busiest
expert (dropless), so no token is ever dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from executor.builders.deferral import grouped_mm
from executor.builders.gpt import GPTShape, Head, init_normal, stage_loss, token_microbatch
from executor.builders.stage import AttentionCore

LAYER_KINDS = ("dense", "moe")


def parse_kinds(spec: Any, num_layers: int) -> list[str]:
    """A per-layer kind list from a list or "dense*3, moe*5"; ValueError if malformed."""
    if spec is None:
        return ["dense"] * num_layers
    if isinstance(spec, str):
        out: list[str] = []
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            name, _, count = part.partition("*")
            out += [name.strip()] * (int(count) if count.strip() else 1)
    else:
        out = [str(k) for k in spec]
    bad = [k for k in out if k not in LAYER_KINDS]
    if bad or len(out) != num_layers:
        raise ValueError(f"layer kinds {out} need {num_layers} entries from {LAYER_KINDS}")
    return out


@dataclass(frozen=True)
class LlamaShape:
    base: GPTShape
    kinds: tuple[str, ...]
    num_experts: int = 4
    top_k: int = 2
    moe_ffn: int = 0
    shared_expert: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> LlamaShape:
        base = GPTShape.from_fields(f)
        return cls(base, tuple(parse_kinds(f.get("layers"), base.num_layers)),
                   int(f.get("num_experts", 4)), int(f.get("moe_top_k", 2)),
                   int(f.get("moe_ffn_hidden_size", base.ffn_hidden_size)),
                   bool(f.get("moe_shared_expert", False)),
                   float(f.get("rope_theta", 10000.0)), float(f.get("norm_eps", 1e-5)))


def rotary_tables(seq: int, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    return torch.cos(ang).float(), torch.sin(ang).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (b, heads, s, d), pairs (i, i + d/2) as in Llama's HF port."""
    a, b = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        b = s.base
        self.heads, self.kv_heads = b.num_heads, b.num_kv_heads
        self.head_dim = b.hidden_size // b.num_heads
        self.q = nn.Linear(b.hidden_size, b.hidden_size, bias=False)
        self.k = nn.Linear(b.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(b.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.core = AttentionCore()
        self.o = nn.Linear(b.hidden_size, b.hidden_size, bias=False)
        cos, sin = rotary_tables(b.seq_length, self.head_dim // 2 * 2, s.rope_theta)
        self.register_buffer("cos", cos[:, : self.head_dim // 2], persistent=False)
        self.register_buffer("sin", sin[:, : self.head_dim // 2], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        a = self.core(rotate(q, cos, sin), rotate(k, cos, sin), v)
        return self.o(a.transpose(1, 2).reshape(b, t, h))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    """Top-k routed experts as batched matmuls, plus an optional shared expert."""

    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        h, f, e = s.base.hidden_size, s.moe_ffn, s.num_experts
        self.top_k = min(s.top_k, e)
        self.router = nn.Linear(h, e, bias=False)
        self.gate = nn.Parameter(torch.empty(e, h, f))
        self.up = nn.Parameter(torch.empty(e, h, f))
        self.down = nn.Parameter(torch.empty(e, f, h))
        self.shared = SwiGLU(h, f) if s.shared_expert else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        tokens = x.reshape(-1, h)
        n, e = tokens.shape[0], self.gate.shape[0]
        probs = torch.softmax(self.router(tokens).float(), dim=-1)
        weight, expert = torch.topk(probs, self.top_k, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        flat = expert.reshape(-1)  # (n * k,) expert of each (token, slot)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=e)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.empty_like(flat)
        slot[order] = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]
        capacity = int(counts.max().item())
        token_of = torch.arange(n, device=x.device).repeat_interleave(self.top_k)
        buf = tokens.new_zeros(e, capacity, h).index_put((flat, slot), tokens[token_of])
        y = grouped_mm(F.silu(grouped_mm(buf, self.gate)) * grouped_mm(buf, self.up), self.down)
        out = (y[flat, slot] * weight.reshape(-1, 1)).view(n, self.top_k, h).sum(1)
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view(b, t, h)


class Layer(nn.Module):
    def __init__(self, s: LlamaShape, kind: str) -> None:
        super().__init__()
        h = s.base.hidden_size
        self.attn_norm = nn.RMSNorm(h, eps=s.norm_eps)
        self.attention = Attention(s)
        self.mlp_norm = nn.RMSNorm(h, eps=s.norm_eps)
        self.mlp = MoE(s) if kind == "moe" else SwiGLU(h, s.base.ffn_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids)


class LlamaBuilder:
    """`ModelBuilder` of the decoder above."""

    def __init__(self, shape: LlamaShape) -> None:
        self.shape = shape
        b = shape.base
        self.num_layers = b.num_layers
        self.activation_shape = (b.micro_batch_size, b.seq_length, b.hidden_size)
        self.dtype = b.torch_dtype

    def layer_kind(self, index: int) -> str:
        return self.shape.kinds[index]

    def embedding(self) -> nn.Module:
        e = Embedding(self.shape.base.vocab_size, self.shape.base.hidden_size)
        init_normal(e, self.num_layers, ())
        return e

    def layer(self, index: int) -> nn.Module:
        layer = Layer(self.shape, self.shape.kinds[index])
        init_normal(layer, self.num_layers, ("o", "down"))
        if isinstance(layer.mlp, MoE):  # expert stacks: fan-in scaled like their Linears
            with torch.no_grad():
                for p in (layer.mlp.gate, layer.mlp.up):
                    p.normal_(0.0, 0.02)
                layer.mlp.down.normal_(0.0, 0.02 / math.sqrt(2 * self.num_layers))
        return layer

    def head(self) -> nn.Module:
        b = self.shape.base
        h = Head(b.hidden_size, b.vocab_size, norm=nn.RMSNorm)
        init_normal(h, self.num_layers, ())
        return h

    def microbatch(self, seed: int, iteration: int, index: int) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
        b = self.shape.base
        return token_microbatch(b.micro_batch_size, b.seq_length, b.vocab_size, seed,
                                iteration, index)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return stage_loss(output, targets)


def build(fields: dict[str, Any]) -> LlamaBuilder:
    return LlamaBuilder(LlamaShape.from_fields(fields))
