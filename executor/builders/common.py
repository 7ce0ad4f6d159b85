"""Pieces every shipped builder shares: dtypes, init, the LM head, loss and data."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ppsim.executor.builders.tensor import (
    TensorGroup,
    column_parallel,
    mark_partial,
    reduce_out,
    shard_input,
    shard_output,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Piece:
    """A part of a module's forward that a memory policy wraps as it wraps a module
    (`forward` replaced), with no parameters of its own: the GPT block's MLP, whose
    Linears stay the block's (their parameter names unchanged)."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


class _SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up as Megatron's fused SwiGLU (bias_swiglu_impl) computes it: only the
    two inputs kept, the SiLU recomputed in the backward."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        return g * up * sig * (1 + gate * (1 - sig)), g * silu


def swiglu(gate: torch.Tensor, up: torch.Tensor, keep_silu: bool) -> torch.Tensor:
    """silu(gate) * up: eager (autograd keeps the SiLU output too, as torchtitan's MLP
    does) when `keep_silu`, else fused (ppsim.costs.arch.Architecture.swiglu_keeps_silu)."""
    return F.silu(gate) * up if keep_silu else _SwiGLUFn.apply(gate, up)


def init_normal(module: nn.Module, num_layers: int, out_proj: tuple[str, ...]) -> None:
    """GPT-2 style init from torch's RNG (ppsim seeds it per piece)."""
    out_std = 0.02 / math.sqrt(2 * num_layers)
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 2)
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                std = out_std if any(part in out_proj for part in leaf[:-1]) else 0.02
                p.normal_(0.0, std)


class Head(nn.Module):
    """Final norm and the vocabulary projection (the loss is the builder's `loss`); at
    tp > 1 the projection column-parallel, each rank its rows of the vocabulary, the norm
    over this rank's tokens under sequence parallelism (ppsim.executor.builders.vocab)."""

    def __init__(self, hidden: int, vocab: int, norm: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.norm = norm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)
        self.tp: TensorGroup | None = None

    def shard(self, g: TensorGroup) -> None:
        """Keep this rank's rows of the vocabulary."""
        self.tp = g
        shard_output(self.out, g)
        if g.sequence_parallel:  # applied to this rank's tokens alone
            mark_partial(self.norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return self.out(self.norm(x))
        return column_parallel(self.norm(x), self.tp, self.out)[0]


def stage_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of one microbatch, computed in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def token_microbatch(batch: int, seq: int, vocab: int, seed: int, iteration: int,
                     index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets, the same on every split.

    Each row is an arithmetic progression modulo the vocabulary (random start
    and stride), so the model has something to learn and the loss falls.
    """
    g = torch.Generator().manual_seed((seed * 7_919 + iteration) * 104_729 + index)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 8, (batch, 1), generator=g)
    seq_ = (start + stride * torch.arange(seq + 1)[None]) % vocab
    return seq_[:, :-1].contiguous(), seq_[:, 1:].contiguous()


class MLP(nn.Module):
    """SwiGLU (gated) or GELU MLP, no biases; at tp > 1 its units split over the tensor
    ranks (ppsim.executor.builders.tensor)."""

    def __init__(self, hidden: int, ffn: int, gated: bool = True,
                 keep_silu: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False) if gated else None
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)
        self.keep_silu = keep_silu
        self.tp: TensorGroup | None = None

    def shard(self, g: TensorGroup) -> None:
        """Keep this rank's units: the gate and up projections column-parallel, the down
        projection row-parallel."""
        self.tp = g
        for linear in self._ups():
            shard_output(linear, g)
        shard_input(self.down, g)

    def _ups(self) -> list[nn.Linear]:
        return [lin for lin in (self.gate, self.up) if lin is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ups = [lin(x) for lin in self._ups()] if self.tp is None \
            else list(column_parallel(x, self.tp, *self._ups()))
        y = F.gelu(ups[0]) if self.gate is None else swiglu(ups[0], ups[1], self.keep_silu)
        return self.down(y) if self.tp is None \
            else reduce_out(F.linear(y, self.down.weight), self.tp)
