"""The built-in GPT: pre-norm decoder blocks (LayerNorm, causal SDPA with GQA, MLP).

The model the analytic cost model describes: attention through
scaled_dot_product_attention with is_causal (FlashAttention's kernel on GPU,
no s x s scores kept; a sliding window as an additive mask), LayerNorm, a GELU
or SwiGLU MLP of any width, and the loss computed in float32 from training-dtype
logits, as Megatron's vocab-parallel cross entropy does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ppsim.costs.layerops import padded_vocab
from ppsim.costs.stack import layer_windows
from ppsim.costs.transformer import layer_kinds
from ppsim.errors import UserError
from ppsim.executor.builders import hybrid
from ppsim.executor.builders.common import (
    DTYPES,
    Head,
    Piece,
    init_normal,
    swiglu,
    token_microbatch,
)
from ppsim.executor.builders.context import token_positions
from ppsim.executor.builders.llama import architecture, describe
from ppsim.executor.builders.qkv_gather import GatheredQKV, gathers, packed, rows
from ppsim.executor.builders.stage import AttentionCore
from ppsim.executor.builders.tensor import (
    ParallelLinears,
    TensorGroup,
    column_parallel,
    mark_partial,
    shard_input,
    shard_output,
    sliced,
)
from ppsim.executor.builders.vocab import (
    shard_rows,
    token_loss,
    vocab_parallel_embedding,
)


@dataclass(frozen=True)
class GPTShape:
    """The architecture fields the executor needs (from `ppsim.config.model.model_fields`)."""

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
    windows: tuple[int, ...] = ()
    """Each layer's sliding window (0: full causal attention); none: every layer full."""
    keep_silu: bool = False
    """A gated MLP keeps its SiLU output (Architecture.swiglu_keeps_silu)."""
    unfused: bool = False
    """The attention core unfused (Architecture.unfused_attention)."""
    table_rows: int = 0
    """Rows of the embedding table and the head: the vocabulary padded as Megatron pads
    it (ppsim.costs.layerops.padded_vocab; the ids stay below vocab_size)."""
    tie_embeddings: bool = False
    """The head's weight is the embedding's table (ppsim.executor.builders.tied)."""

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> GPTShape:
        # The cost model's Architecture owns the defaults, so the model that runs
        # is the model that was simulated; other keys belong to other readers.
        a = architecture(f)
        return cls(a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads,
                   a.ffn_hidden_size, a.vocab_size, a.seq_length, a.micro_batch_size,
                   a.gated_mlp, a.dtype, layer_windows(a), a.swiglu_keeps_silu,
                   a.unfused_attention, padded_vocab(a), a.tie_embeddings)

    def window(self, index: int) -> int:
        """Layer `index`'s sliding window (0: full causal attention)."""
        return self.windows[index] if self.windows else 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention (GQA) and an MLP."""

    def __init__(self, s: GPTShape, window: int = 0) -> None:
        super().__init__()
        h, self.heads, self.kv_heads = s.hidden_size, s.num_heads, s.num_kv_heads
        self.head_dim = h // s.num_heads
        self.norm1 = nn.LayerNorm(h)
        self.q = nn.Linear(h, h)
        self.kv = nn.Linear(h, 2 * self.kv_heads * self.head_dim)
        self.attention = AttentionCore(window, s.unfused)
        self.proj = nn.Linear(h, h)
        self.norm2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, s.ffn_hidden_size)
        self.fc3 = nn.Linear(h, s.ffn_hidden_size) if s.gated_mlp else None
        self.fc2 = nn.Linear(s.ffn_hidden_size, h)
        self.keep_silu = s.keep_silu
        self.mlp = Piece(self._mlp)  # Megatron's `mlp` recompute module
        self.tp: TensorGroup | None = None
        self.qkv: nn.Linear | None = None
        """At tp above the key/value groups: this rank's rows of the interleaved QKV
        (q and kv then None)."""
        self.gathered: GatheredQKV | None = None
        self.columns: ParallelLinears | None = None
        """At tp > 1: QKV's projections (a memory policy's `qkv_linear`)."""
        self.rows: ParallelLinears | None = None
        """At tp > 1: the output projection (`attn_proj`)."""
        self.down: ParallelLinears | None = None
        """At tp > 1: the MLP's second matmul, row-parallel."""

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor-parallel rank's heads and MLP units (ppsim.executor.builders.tensor);
        at tp above the key/value groups its rows of the interleaved QKV, biases with
        them (ppsim.executor.builders.qkv_gather)."""
        self.tp = g
        self._shard_attention(g)
        shard_output(self.fc1, g)
        if self.fc3 is not None:
            shard_output(self.fc3, g)
        shard_input(self.proj, g)
        shard_input(self.fc2, g)
        self.columns = ParallelLinears(g, self._projections())
        self.rows = ParallelLinears(g, (self.proj,), row=True)
        self.down = ParallelLinears(g, (self.fc2,), row=True)
        if g.sequence_parallel:  # applied to this rank's tokens alone
            mark_partial(self.norm1, self.norm2, self.proj.bias, self.fc2.bias)

    def _shard_attention(self, g: TensorGroup) -> None:
        assert self.q is not None and self.kv is not None
        if gathers(self.kv_heads, g):
            self.gathered = GatheredQKV(g, self.heads, self.kv_heads, self.head_dim, False)
            self.qkv = self.gathered.fuse(rows(self.q), *packed(self.kv, 2), None)
            self.q = self.kv = None
            self.heads, self.kv_heads = self.heads // g.size, 1
            return
        self.heads, self.kv_heads = self.heads // g.size, self.kv_heads // g.size
        shard_output(self.q, g)
        shard_output(self.kv, g, groups=2)

    def _projections(self) -> tuple[nn.Linear, ...]:
        return tuple(lin for lin in (self.q, self.kv, self.qkv) if lin is not None)

    def _mlp(self, y: torch.Tensor) -> torch.Tensor:
        """The MLP on the normed input, before the residual add."""
        up = [self.fc1] + ([self.fc3] if self.fc3 is not None else [])
        outs = [lin(y) for lin in up] if self.tp is None else column_parallel(y, self.tp, *up)
        y = swiglu(outs[0], outs[1], self.keep_silu) if len(outs) == 2 else F.gelu(outs[0])
        return self.fc2(y) if self.down is None else self.down(y)

    def _tensor_parallel(self, x: torch.Tensor) -> torch.Tensor:
        assert self.columns is not None and self.rows is not None
        outs = self.columns(self.norm1(x))  # every token (sequence parallelism: gathered)
        b, t, _ = outs[0].shape
        if self.gathered is not None:  # the QKV's whole width gathered, this rank's sliced
            q, k, v = (y.view(b, t, -1, self.head_dim).transpose(1, 2)
                       for y in self.gathered.split(outs[0]))
        else:
            q = outs[0].view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k, v = outs[1].view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = self.attention(q, k, v)
        x = x + self.rows(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp is not None:
            return self._tensor_parallel(x)
        b, t, h = x.shape
        y = self.norm1(x)
        q = self.q(y).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(y).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = self.attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    """Token and learned position embeddings; at tp > 1 the tokens' table split by
    vocabulary (ppsim.executor.builders.vocab.vocab_parallel_embedding), the positions' whole,
    the sum split by tokens under sequence parallelism."""

    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.tokens = nn.Embedding(s.table_rows or s.vocab_size, s.hidden_size)
        self.positions = nn.Embedding(s.seq_length, s.hidden_size)
        self.tp: TensorGroup | None = None

    def shard(self, g: TensorGroup) -> None:
        """Keep this rank's rows of the tokens' table."""
        self.tp = g
        shard_rows(self.tokens, g)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = token_positions(ids.shape[1], ids.device)
        if self.tp is None:
            return self.tokens(ids) + self.positions(pos)[None]
        return vocab_parallel_embedding(ids, self.tokens.weight, self.tp,
                                        self.positions(pos)[None])


class GPTBuilder:
    """`ModelBuilder` of the GPT above."""

    def __init__(self, shape: GPTShape) -> None:
        self.shape = shape
        self.num_layers = shape.num_layers
        self.activation_shape = (shape.micro_batch_size, shape.seq_length, shape.hidden_size)
        self.dtype = shape.torch_dtype
        self.tie_embeddings = shape.tie_embeddings

    def embedding(self) -> nn.Module:
        e = Embedding(self.shape)
        init_normal(e, self.num_layers, ())
        return sliced(e)

    def layer_kind(self, index: int) -> str:
        """dense, windowed layers apart (a profile times each kind)."""
        return "dense+window" if self.shape.window(index) else "dense"

    def layer(self, index: int) -> nn.Module:
        b = Block(self.shape, self.shape.window(index))
        init_normal(b, self.num_layers, ("proj", "fc2"))
        return sliced(b)

    def head(self) -> nn.Module:
        h = Head(self.shape.hidden_size, self.shape.table_rows)
        init_normal(h, self.num_layers, ())
        return sliced(h)

    def microbatch(self, seed: int, iteration: int, index: int) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
        s = self.shape
        return token_microbatch(s.micro_batch_size, s.seq_length, s.vocab_size, seed,
                                iteration, index)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_loss(output, targets)


def build(fields: dict[str, Any]) -> Any:
    """The default builder: the model the [model] fields describe.

    This GPT when they describe one (LayerNorm, learned positions, dense layers);
    a hybrid pattern's stack (ppsim.executor.builders.hybrid); otherwise (RMSNorm,
    rotary, MoE layers, a head_dim of its own, query and key norms, an output gate) the
    decoder of ppsim.executor.builders.llama built exactly as described, so a run or a
    profile measures what the cost model assumes.
    """
    a = architecture(fields)
    if a.fp8:
        raise UserError("model.fp8", "the executor's CPU processes have no FP8 or FP4 "
                        "matmuls", "drop fp8 (--fp8-format, --fp4-format) to run the model "
                        "(the costs price them)")
    if a.fp32_residual:
        raise UserError("model.fp32_residual", "the executor keeps the residual stream in the "
                        "training dtype", "drop fp32_residual (--fp32-residual-connection) to "
                        "run the model (the costs price it)")
    if a.hybrid_layer_pattern or a.experimental_attention_variant:
        return hybrid.build(fields)
    plain = (not a.rmsnorm and a.learned_positions and a.attention == "gqa"
             and not (a.qk_layernorm or a.attention_output_gate)
             and a.head_dim in (0, a.hidden_size // a.num_heads)
             and set(layer_kinds(a)) == {"dense"})
    return GPTBuilder(GPTShape.from_fields(fields)) if plain else describe(fields)
