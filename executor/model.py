"""A GPT-style decoder in plain torch, built one pipeline stage at a time.

Every parameter is initialised from a generator seeded by what it belongs to
(layer index, embedding, head), never by the order modules are built in, so
any split of the same model starts from bit-identical weights and a pipeline
run can be checked against a single-process run.

Linear layers can defer their weight gradients (zero-bubble B/W split): while
`WeightGradStore.deferring` is set, a backward computes only the input
gradient and queues the weight-gradient matmul under the current key; W runs
the queue later. Norm and embedding weights (cheap, elementwise) still get
their gradients in B, as in Megatron's zero-bubble implementation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ppsim.transformer import Architecture

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class GPTShape:
    """The architecture fields the executor needs (from `ppsim.config.model_fields`)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    micro_batch_size: int
    gated_mlp: bool
    dtype: str

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> GPTShape:
        # The cost model's Architecture owns the defaults, so the model that runs
        # is the model that was simulated.
        a = Architecture(**{k: v for k, v in f.items() if k != "kind"})
        return cls(a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads,
                   a.ffn_hidden_size, a.vocab_size, a.seq_length, a.micro_batch_size,
                   a.gated_mlp, a.dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


# ------------------------------------------------------------------ deferred weight grads


class WeightGradStore:
    """Queues of weight-gradient closures keyed by (stage, microbatch)."""

    enabled = False
    """True when the schedule has separate W actions; Linear then uses `_LinearFn`."""
    deferring = False
    key: tuple[int, int] | None = None
    queues: dict[tuple[int, int], list[Callable[[], None]]] = {}

    @classmethod
    def push(cls, fn: Callable[[], None]) -> None:
        assert cls.key is not None
        cls.queues.setdefault(cls.key, []).append(fn)

    @classmethod
    def run(cls, key: tuple[int, int]) -> None:
        for fn in cls.queues.pop(key, []):
            fn()

    @classmethod
    def held_bytes(cls, key: tuple[int, int]) -> int:
        return sum(getattr(fn, "nbytes", 0) for fn in cls.queues.get(key, []))


def _accumulate(p: torch.Tensor, g: torch.Tensor) -> None:
    if p.grad is None:
        p.grad = g
    else:
        p.grad += g


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias = weight, bias  # parameters (leaves): a reference is enough
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, Any, Any]:
        (x,) = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        gx = gy @ weight if ctx.needs_input_grad[0] else None
        gy2 = gy.reshape(-1, gy.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        if not WeightGradStore.deferring:
            return gx, gy2.t() @ x2, (gy2.sum(0) if bias is not None else None)

        def weight_grad() -> None:
            _accumulate(weight, gy2.t() @ x2)
            if bias is not None:
                _accumulate(bias, gy2.sum(0))

        # What the queue keeps alive until W: the layer input and the output grad.
        weight_grad.nbytes = (x2.numel() * x2.element_size()  # type: ignore[attr-defined]
                              + gy2.numel() * gy2.element_size())
        WeightGradStore.push(weight_grad)
        return gx, None, None


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if WeightGradStore.enabled and torch.is_grad_enabled():
            return _LinearFn.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


# ------------------------------------------------------------------ modules


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention (GQA) and an MLP."""

    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        h, self.heads, self.kv_heads = s.hidden_size, s.num_heads, s.num_kv_heads
        self.head_dim = h // s.num_heads
        self.norm1 = nn.LayerNorm(h)
        self.q = Linear(h, h)
        self.kv = Linear(h, 2 * self.kv_heads * self.head_dim)
        self.proj = Linear(h, h)
        self.norm2 = nn.LayerNorm(h)
        self.gated = s.gated_mlp
        self.fc1 = Linear(h, s.ffn_hidden_size)
        self.fc3 = Linear(h, s.ffn_hidden_size) if s.gated_mlp else None
        self.fc2 = Linear(s.ffn_hidden_size, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        y = self.norm1(x)
        q = self.q(y).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(y).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        y = self.norm2(x)
        if self.fc3 is not None:
            y = F.silu(self.fc1(y)) * self.fc3(y)
        else:
            y = F.gelu(self.fc1(y))
        return x + self.fc2(y)


class Embedding(nn.Module):
    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.positions = nn.Embedding(s.seq_length, s.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(pos)[None]


class Head(nn.Module):
    """Final norm and the vocabulary projection (the loss is applied outside)."""

    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(s.hidden_size)
        self.out = Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class StageModule(nn.Module):
    """One virtual stage: [embedding] + decoder layers offset..offset+n-1 + [head].

    Layers are registered under their global index ("layers.5.q.weight"), so a
    parameter has the same name whichever stage holds it.
    """

    def __init__(self, s: GPTShape, offset: int, num_layers: int, has_embedding: bool,
                 has_head: bool, seed: int = 0) -> None:
        super().__init__()
        self.embedding = Embedding(s) if has_embedding else None
        _init(self.embedding, seed, "embedding", s)
        self.layers = nn.ModuleDict()
        for i in range(offset, offset + num_layers):
            block = Block(s)
            _init(block, seed, f"layer{i}", s)
            self.layers[str(i)] = block
        self.head = Head(s) if has_head else None
        _init(self.head, seed, "head", s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.layers.values():
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def _init(module: nn.Module | None, seed: int, what: str, s: GPTShape) -> None:
    """GPT-2 style init from a generator seeded by `what`, so placement never matters."""
    if module is None:
        return
    g = torch.Generator().manual_seed(seed * 1_000_003 + sum(ord(c) * 31 ** k
                                                             for k, c in enumerate(what)))
    out_std = 0.02 / math.sqrt(2 * s.num_layers)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                std = out_std if name.startswith(("proj", "fc2")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)


def stage_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of one microbatch, computed in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def full_model(s: GPTShape, seed: int = 0) -> StageModule:
    """The whole model on one process: the reference the pipeline must match."""
    return StageModule(s, 0, s.num_layers, True, True, seed)


# ------------------------------------------------------------------ synthetic data


def microbatch(s: GPTShape, seed: int, iteration: int, index: int) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """Token ids and next-token targets for one microbatch, the same on every split.

    Each row is an arithmetic progression modulo the vocabulary (random start
    and stride), so the model has something to learn and the loss falls.
    """
    g = torch.Generator().manual_seed((seed * 7_919 + iteration) * 104_729 + index)
    b, t, v = s.micro_batch_size, s.seq_length, s.vocab_size
    start = torch.randint(0, v, (b, 1), generator=g)
    stride = torch.randint(1, 8, (b, 1), generator=g)
    seq = (start + stride * torch.arange(t + 1)[None]) % v
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
