"""A builder of one's own that splits itself over tensor-parallel ranks
(`--model tests/model_tp.py:build --tp 2`): a small Llama-style decoder written as a
torchtitan model is (separate wq, wk, wv and wo; w1, w2 and w3; heads read from the
tensors' shapes), with a `parallelize` that applies ppsim's column, row, tokens,
embedding and head splits where torchtitan's plan puts ColwiseParallel, RowwiseParallel
and SequenceParallel."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 64, 4, 2, 96, 256


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        d = HIDDEN // HEADS
        self.head_dim = d
        self.wq = nn.Linear(HIDDEN, HEADS * d, bias=False)
        self.wk = nn.Linear(HIDDEN, KV_HEADS * d, bias=False)
        self.wv = nn.Linear(HIDDEN, KV_HEADS * d, bias=False)
        self.wo = nn.Linear(HEADS * d, HIDDEN, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # This rank's heads and, under sequence parallelism, every rank's tokens: both
        # read from the projections' outputs, not from x.
        q, k, v = (p.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
                   for p in (self.wq(x), self.wk(x), self.wv(x)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).flatten(2))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(HIDDEN)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(HIDDEN)
        self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w3 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(HIDDEN)
        self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


class Builder:
    def __init__(self, fields: dict[str, Any]) -> None:
        self.num_layers = int(fields.get("num_layers", 8))
        self.seq = int(fields.get("seq_length", 64))
        self.activation_shape = (int(fields.get("micro_batch_size", 2)), self.seq, HIDDEN)
        self.dtype = torch.float32

    def embedding(self) -> nn.Module:
        return nn.Embedding(VOCAB, HIDDEN)

    def layer(self, index: int) -> nn.Module:
        return Block()

    def head(self) -> nn.Module:
        return Head()

    def parallelize(self, module: nn.Module, piece: str, tp: Any) -> None:
        """torchtitan's Llama plan: heads and MLP units over the ranks, the vocabulary too,
        the norms on each rank's tokens under sequence parallelism."""
        if piece == "embedding":
            tp.embedding(module)
        elif piece == "head":
            tp.tokens(module.norm)
            tp.head(module.output)
        else:
            a = module.attention
            tp.column(a.wq, a.wk, a.wv, module.w1, module.w3)
            tp.row(a.wo, module.w2)
            tp.tokens(module.attention_norm, module.ffn_norm)

    def microbatch(self, seed: int, iteration: int, index: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed((seed * 7_919 + iteration) * 104_729 + index)
        ids = torch.randint(0, VOCAB, (self.activation_shape[0], self.seq + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.float().flatten(0, 1), targets.flatten())


def build(fields: dict[str, Any]) -> Builder:
    return Builder(fields)
