"""A Llama/Qwen-style decoder: RMSNorm, rotary embeddings, GQA, SwiGLU, optional MoE.

It follows the `[model]` architecture fields (ppsim.arch.Architecture), so it
runs the model the cost model describes: `norm` (RMSNorm, or LayerNorm),
`position` (rotary, or learned), `gated_mlp` (SwiGLU, or GELU), `head_dim`,
`qk_layernorm` (a norm on each query and key head), `attention_output_gate`,
and the layer kinds of `layers` ("dense*3, moe*5"; all MoE when num_experts >
0 and no kinds are given). A MoE layer has `num_experts` experts of width
`moe_ffn_hidden_size`, routes each token to its `top_k` (softmax router in
fp32, weights renormalised over the chosen k, no auxiliary loss), runs them as a
dropless grouped GEMM (each (token, slot) pair once, sorted by expert, no expert
padded to the busiest: deferral.segmented_mm), and
adds the always-on shared experts as one MLP of `shared_width` (any width, as
Megatron's SharedExpertMLP; `shared_expert_gate` scales it by a sigmoid gate).
`attention = "mla"` builds DeepSeek's latent attention
(ppsim.executor.builders.mla). `attention_window` and `window_attn_skip_freq` give
layers a sliding window (ppsim.executor.builders.stage.AttentionCore). Dropout is not
built. At tp > 1 a decoder with grouped-query or latent attention (ppsim.executor.
builders.mla) splits as the built-in GPT does
(ppsim.executor.builders.tensor, ppsim.executor.builders.vocab): heads and MLP units over
the tensor ranks, the vocabulary too, with or without sequence parallelism (at tp above
the key/value groups, QKV gathered as Megatron does: ppsim.executor.builders.qkv_gather);
the query and key norms, applied to each rank's heads, sum their gradients over the ranks. Its MoE
layers (sequence parallel) split as ppsim.executor.builders.moe says: each expert whole
(etp 1) or split over the tensor ranks (etp = tp, Megatron's default).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from ppsim.costs.layerops import padded_vocab
from ppsim.costs.stack import layer_windows
from ppsim.costs.transformer import Architecture, layer_kinds
from ppsim.errors import UserError
from ppsim.executor.builders.common import (
    DTYPES,
    MLP,
    Head,
    init_normal,
    token_microbatch,
)
from ppsim.executor.builders.context import own_tokens, token_positions
from ppsim.executor.builders.mla import LatentAttention
from ppsim.executor.builders.moe import MoE, init_experts
from ppsim.executor.builders.qkv_gather import GatheredQKV, gathers, rows
from ppsim.executor.builders.rotary import rotary_tables, rotate
from ppsim.executor.builders.stage import AttentionCore
from ppsim.executor.builders.tensor import (
    ParallelLinears,
    TensorGroup,
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

_ARCH = {f.name for f in fields(Architecture)}


def architecture(f: dict[str, Any]) -> Architecture:
    """The Architecture of the fields; a list of layer kinds is accepted too."""
    kw = {k: v for k, v in f.items() if k in _ARCH}
    if isinstance(kw.get("layers"), (list, tuple)):
        kw["layers"] = ", ".join(str(k) for k in kw["layers"])
    return Architecture(**kw)


def parse_kinds(spec: Any, num_layers: int) -> list[str]:
    """Per-layer kinds from a list or "dense*3, moe*5" (ppsim.arch's rule); none: dense."""
    if not spec:
        return ["dense"] * num_layers
    a = architecture({"num_layers": num_layers, "hidden_size": 8, "num_heads": 1,
                      "num_kv_heads": 1, "ffn_hidden_size": 8, "vocab_size": 8,
                      "seq_length": 8, "layers": spec, "num_experts": 1, "top_k": 1,
                      "moe_ffn_hidden_size": 8})
    return list(layer_kinds(a))


@dataclass(frozen=True)
class LlamaShape:
    arch: Architecture
    kinds: tuple[str, ...]
    windows: tuple[int, ...]
    """Each layer's sliding window (0: full causal attention)."""

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> LlamaShape:
        a = architecture(f)
        if a.attention == "mla" and (not a.kv_lora_rank or a.qk_rope_head_dim % 2):
            raise UserError("model.kv_lora_rank", "MLA needs kv_lora_rank > 0 and an even "
                            f"qk_rope_head_dim (got {a.kv_lora_rank}, {a.qk_rope_head_dim})",
                            "set kv_lora_rank and qk_rope_head_dim as DeepSeek-V3 does "
                            "(512, 64)")
        if a.attention == "mla" and a.attention_window:
            raise UserError("model.attention_window", "the shipped latent attention runs "
                            "no sliding window", "drop attention_window, or give a builder "
                            "of your own")
        return cls(a, layer_kinds(a), layer_windows(a))

    @property
    def head_dim(self) -> int:
        return self.arch.head_dim or self.arch.hidden_size // self.arch.num_heads

    def norm(self, width: int) -> nn.Module:
        return RMSNorm(width) if self.arch.rmsnorm else nn.LayerNorm(width)


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm as fused kernels (Apex, Megatron, Transformer Engine) compute it: statistics
    in fp32, and only the input and the fp32 1/rms kept for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(_stats_dtype(x))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd)
        ctx.weight = weight  # a parameter (leaf): a reference is enough
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, Any, None]:
        x, rstd = ctx.saved_tensors
        weight = ctx.weight
        dt = rstd.dtype
        xhat = x.to(dt) * rstd
        g = gy.to(dt) * weight.to(dt)
        gx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        gw = (gy.to(dt) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return gx.to(x.dtype), gw.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return _RMSNormFn.apply(x, self.weight, self.eps)
        xf = x.to(_stats_dtype(x))
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
                ).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, s: LlamaShape, window: int = 0) -> None:
        super().__init__()
        a, hd = s.arch, s.head_dim
        self.heads, self.kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, hd
        self.q = nn.Linear(a.hidden_size, a.num_heads * hd, bias=False)
        self.k = nn.Linear(a.hidden_size, a.num_kv_heads * hd, bias=False)
        self.v = nn.Linear(a.hidden_size, a.num_kv_heads * hd, bias=False)
        self.core = AttentionCore(window, a.unfused_attention)
        self.o = nn.Linear(a.num_heads * hd, a.hidden_size, bias=False)
        self.q_norm = s.norm(hd) if a.qk_layernorm else None
        self.k_norm = s.norm(hd) if a.qk_layernorm else None
        self.gate = nn.Linear(a.hidden_size, a.num_heads * hd, bias=False) \
            if a.attention_output_gate else None
        self.qkv: nn.Linear | None = None
        """At tp above the key/value groups: this rank's rows of the interleaved QKV."""
        self.gathered: GatheredQKV | None = None
        self.tp: TensorGroup | None = None
        self.columns: ParallelLinears | None = None
        """At tp > 1: the projections of the normed input (a policy's `qkv_linear`)."""
        self.rows: ParallelLinears | None = None
        """At tp > 1: the output projection (`attn_proj`)."""
        self.rotary = a.rotary
        if self.rotary:
            cos, sin = rotary_tables(a.seq_length, hd // 2 * 2, 10000.0)
            # each row at a token of this rank's, in order (context parallelism)
            self.register_buffer("cos", own_tokens(cos[:, : hd // 2], 0), persistent=False)
            self.register_buffer("sin", own_tokens(sin[:, : hd // 2], 0), persistent=False)

    def input_linears(self) -> list[nn.Module | ParallelLinears]:
        """The projections that read the layer's normed input and the query and key norms
        (Megatron's qkv_linear offloads them together)."""
        norms = [m for m in (self.q_norm, self.k_norm) if m is not None]
        if self.columns is not None:
            return [self.columns, *norms]
        return [*self._projections(), *norms]

    def output_linear(self) -> nn.Module | ParallelLinears:
        """The output projection (Megatron's attn_proj offloads its input)."""
        return self.o if self.rows is None else self.rows

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor rank's query and key/value heads (and the gate's); at tp above
        the key/value groups, its rows of the interleaved QKV (ppsim.executor.builders.
        qkv_gather)."""
        self.tp = g
        if gathers(self.kv_heads, g):
            self.gathered = GatheredQKV(g, self.heads, self.kv_heads, self.head_dim,
                                        self.gate is not None)
            self.qkv = self.gathered.fuse(rows(self.q), rows(self.k), rows(self.v),
                                          None if self.gate is None else rows(self.gate))
            self.q = self.k = self.v = self.gate = None
            self.heads, self.kv_heads = self.heads // g.size, 1
        else:
            self.heads, self.kv_heads = self.heads // g.size, self.kv_heads // g.size
            for linear in self._projections():
                shard_output(linear, g)
        shard_input(self.o, g)
        mark_partial(self.q_norm, self.k_norm)  # each rank's heads: partial gradients
        self.columns = ParallelLinears(g, tuple(self._projections()))
        self.rows = ParallelLinears(g, (self.o,), row=True)

    def _projections(self) -> list[nn.Linear]:
        return [lin for lin in (self.q, self.k, self.v, self.gate, self.qkv) if lin is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.columns is None:
            outs = [lin(x) for lin in self._projections()]
        else:  # every token (sequence parallelism: gathered)
            outs = list(self.columns(x))
        if self.gathered is not None:  # the QKV's whole width gathered, this rank's sliced
            outs = self.gathered.split(outs[0])
        b, t, _ = outs[0].shape
        # Rotated and attended in (b, s, heads, d) memory, so attention's output is laid out
        # as the projection reads it: one tensor kept for both, as FlashAttention's [s, b, h]
        # output is in Megatron (a (b, heads, s, d) output would need a copy for it).
        q = outs[0].view(b, t, self.heads, self.head_dim)
        k = outs[1].view(b, t, self.kv_heads, self.head_dim)
        v = outs[2].view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            cos, sin = self.cos[:t, None], self.sin[:t, None]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = a.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        if len(outs) == 4:  # the output gate's
            out = OutputGate.apply(out, outs[3])
        return self.output_linear()(out)


class OutputGate(torch.autograd.Function):
    """x * sigmoid(gate), the sigmoid in fp32, as Megatron's compiled _apply_output_gate:
    x and the gate kept, the sigmoid made again in the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, gate)
        return (x * torch.sigmoid(gate.to(_stats_dtype(gate)))).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, gate = ctx.saved_tensors
        dt = _stats_dtype(gate)
        s, g = torch.sigmoid(gate.to(dt)), gy.to(dt)
        return (g * s).to(x.dtype), (g * x.to(dt) * s * (1 - s)).to(gate.dtype)




class Layer(nn.Module):
    def __init__(self, s: LlamaShape, kind: str, window: int = 0) -> None:
        super().__init__()
        a = s.arch
        self.attn_norm = s.norm(a.hidden_size)
        self.attention = LatentAttention(s) if a.attention == "mla" else Attention(s, window)
        self.mlp_norm = s.norm(a.hidden_size)
        self.mlp = MoE(s) if kind == "moe" else MLP(a.hidden_size, a.ffn_hidden_size,
                                                     a.gated_mlp, a.swiglu_keeps_silu)

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor rank's heads (grouped-query or latent attention) and MLP units."""
        self.attention.shard(g)
        self.mlp.shard(g)
        if g.sequence_parallel:  # applied to this rank's tokens alone
            mark_partial(self.attn_norm, self.mlp_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Embedding(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        a = s.arch
        self.tokens = nn.Embedding(padded_vocab(a), a.hidden_size)  # as Megatron pads it
        self.positions = nn.Embedding(a.position_params // a.hidden_size, a.hidden_size) \
            if a.learned_positions else None
        self.tp: TensorGroup | None = None

    def shard(self, g: TensorGroup) -> None:
        """Keep this rank's rows of the tokens' table."""
        self.tp = g
        shard_rows(self.tokens, g)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = None if self.positions is None else \
            self.positions(token_positions(ids.shape[1], ids.device))[None]
        if self.tp is not None:
            return vocab_parallel_embedding(ids, self.tokens.weight, self.tp, pos)
        x = self.tokens(ids)
        return x if pos is None else x + pos


class LlamaBuilder:
    """`ModelBuilder` of the decoder above."""

    def __init__(self, shape: LlamaShape) -> None:
        self.shape = shape
        a = shape.arch
        self.num_layers = a.num_layers
        self.activation_shape = (a.micro_batch_size, a.seq_length, a.hidden_size)
        self.dtype = DTYPES[a.dtype]
        self.tie_embeddings = a.tie_embeddings

    def layer_kind(self, index: int) -> str:
        """dense or moe, windowed layers apart (a profile times each kind)."""
        return self.shape.kinds[index] + ("+window" if self.shape.windows[index] else "")

    def embedding(self) -> nn.Module:
        e = Embedding(self.shape)
        init_normal(e, self.num_layers, ())
        return sliced(e)

    def layer(self, index: int) -> nn.Module:
        layer = Layer(self.shape, self.shape.kinds[index], self.shape.windows[index])
        init_normal(layer, self.num_layers, ("o", "down"))
        if isinstance(layer.mlp, MoE):
            init_experts(layer.mlp, self.num_layers)
        return sliced(layer)

    def head(self) -> nn.Module:
        a = self.shape.arch
        # the vocabulary padded as Megatron pads it; the ids stay below vocab_size
        h = Head(a.hidden_size, padded_vocab(a), norm=self.shape.norm)
        init_normal(h, self.num_layers, ())
        return sliced(h)

    def microbatch(self, seed: int, iteration: int, index: int) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
        a = self.shape.arch
        return token_microbatch(a.micro_batch_size, a.seq_length, a.vocab_size, seed,
                                iteration, index)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_loss(output, targets)


def build(fields: dict[str, Any]) -> LlamaBuilder:
    """Llama's choices (RMSNorm, rotary, SwiGLU) on the fields' sizes and layer kinds."""
    return LlamaBuilder(LlamaShape.from_fields({**fields, "gated_mlp": True,
                                                "norm": "rmsnorm", "position": "rotary"}))


def describe(fields: dict[str, Any]) -> LlamaBuilder:
    """The decoder exactly as the fields describe it (the GPT builder delegates here for
    anything it does not build itself: RMSNorm, rotary, MoE layers, head_dim)."""
    return LlamaBuilder(LlamaShape.from_fields(fields))

