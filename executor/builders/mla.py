"""DeepSeek's multi-head latent attention (MLA), built as Megatron-Core builds it.

Queries go through a low-rank latent (q_down, q_norm, q_up; or one q_proj when
q_lora_rank is 0); keys and values through one latent (kv_down, kv_norm, then k_up
and v_up per head), and each key's rotary part through one shared projection
(k_rope, `qk_rope_head_dim` wide, the same for every head). Megatron's kv_down is one
matmul to kv_lora_rank + qk_rope_head_dim split in two; here they are two Linears of
those widths (the same flops and parameters), so the latent autograd keeps is a
tensor of its own, the width the cost model counts (ppsim.costs.modules).

At tp > 1 (as Megatron's MLA): the down projections and their norms are whole on every
tensor rank, over its own tokens under sequence parallelism (their gradients then summed
over the ranks), and the up projections, attention and the output projection split by
heads, the latents (and the rotary key part) gathered for them. Under torchtitan's
(`TensorGroup.saves_gathered`, as its DeepSeek-V3 plan) the layer's normed input is
gathered once instead and the down projections, their norms and the rotary key run
replicated on every token (their partial gradients summed over the ranks), so each
rank keeps the latents whole and the up projections read them with no collective
(ppsim.costs.saved.GATHERED).

`UpProjection` is Megatron's `mla_up_proj`: the up projections and the rotary, whose
outputs (q, k, v) are what attention keeps; recomputing it (executor/builders/discard.py)
frees them and keeps the latents and the rotary key part instead.

Attention itself: query and key heads are qk_head_dim + qk_rope_head_dim wide, value
heads v_head_dim. torch's fused CPU attention wants one width, and its fallback keeps
the s x s scores; `_FlashMLA` pads the values with zeros to the key width for the fused
kernel (forward and backward), keeping q, k, v, the output and its log-sum-exp at their
own widths: what FlashAttention keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ppsim.executor.builders.context import context, own_tokens
from ppsim.executor.builders.rotary import rotary_tables, rotate
from ppsim.executor.builders.stage import AttentionCore
from ppsim.executor.builders.tensor import (
    ParallelLinears,
    TensorGroup,
    column_parallel,
    mark_partial,
    shard_input,
    shard_output,
    tokens_in,
)

if TYPE_CHECKING:  # llama.py builds this module: a runtime import would be a cycle
    from ppsim.executor.builders.llama import LlamaShape

_aten = torch.ops.aten


class _FlashMLA(torch.autograd.Function):
    """Causal attention of (b, heads, s, d_qk) queries and keys over (b, heads, s, d_v)
    values by the fused CPU kernel, the values padded to d_qk inside."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pad = q.shape[-1] - v.shape[-1]
        out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, F.pad(v, (0, pad)), 0.0, True)
        # The output at its own width in (b, s, heads, d_v) memory: the projection reads it.
        out = out[..., : v.shape[-1]].transpose(1, 2).contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        pad = q.shape[-1] - v.shape[-1]
        gq, gk, gv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
            F.pad(grad, (0, pad)), q, k, F.pad(v, (0, pad)), F.pad(out, (0, pad)), lse,
            0.0, True)
        return gq, gk, gv[..., : v.shape[-1]]


class LatentAttentionCore(AttentionCore):
    """softmax(QK^T)V, causal, with value heads narrower than query and key heads."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.unfused or q.shape[-1] == v.shape[-1] or q.device.type != "cpu" \
                or context() is not None:
            return super().forward(q, k, v)
        return _FlashMLA.apply(q, k, v)


class UpProjection(nn.Module):
    """Megatron's `mla_up_proj`: q, k and v per head from the latents, rotary applied.
    Inputs (b, s, width); outputs in (b, s, heads, d) memory."""

    def __init__(self, *, q_in: int, kv_lora: int, heads: int, nope: int, rope: int,
                 value: int, rotary: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        super().__init__()
        self.heads, self.nope, self.rope, self.value = heads, nope, rope, value
        self.q_up = nn.Linear(q_in, heads * (nope + rope), bias=False)
        self.k_up = nn.Linear(kv_lora, heads * nope, bias=False)
        self.v_up = nn.Linear(kv_lora, heads * value, bias=False)
        self.rotary = rotary is not None
        if rotary is not None:
            # each row at a token of this rank's, in order (context parallelism)
            self.register_buffer("cos", own_tokens(rotary[0], 0), persistent=False)
            self.register_buffer("sin", own_tokens(rotary[1], 0), persistent=False)
        self.tp: TensorGroup | None = None
        self.q_columns: ParallelLinears | None = None
        """At tp > 1: q_up as one piece a policy wraps (without a query latent it reads
        the layer's normed input: Megatron's `qkv_linear`)."""
        self.whole_latents = False
        """Its inputs are every token's, the same on every tensor rank (torchtitan's)."""

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor rank's heads."""
        self.tp, self.heads = g, self.heads // g.size
        for linear in (self.q_up, self.k_up, self.v_up):
            shard_output(linear, g)
        self.whole_latents = keeps_latents_whole(g)
        if not self.whole_latents:
            self.q_columns = ParallelLinears(g, (self.q_up,))

    def query_linear(self) -> nn.Module | ParallelLinears:
        """q_up, column-parallel at tp > 1."""
        return self.q_up if self.q_columns is None else self.q_columns

    def _projected(self, q_in: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor
                   ) -> tuple[torch.Tensor, ...]:
        """q_up(q_in), k_up and v_up(kv_latent), k_rope: every token's, this rank's heads."""
        if self.tp is None or self.whole_latents:
            return self.q_up(q_in), self.k_up(kv_latent), self.v_up(kv_latent), k_rope
        assert self.q_columns is not None
        (q,) = self.q_columns(q_in)
        k, v = column_parallel(kv_latent, self.tp, self.k_up, self.v_up)
        return q, k, v, tokens_in(k_rope, self.tp)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        if not self.rotary:
            return x
        t = x.shape[1]
        return rotate(x, self.cos[:t, None], self.sin[:t, None])

    def forward(self, q_in: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_up, k_up, v_up, k_rope = self._projected(q_in, kv_latent, k_rope)
        b, t, _ = q_up.shape
        h = self.heads
        q_nope, q_pe = q_up.view(b, t, h, self.nope + self.rope).split(
            [self.nope, self.rope], dim=-1)
        q = torch.cat((q_nope, self._rotate(q_pe)), dim=-1)
        k_pe = self._rotate(k_rope.view(b, t, 1, self.rope)).expand(b, t, h, self.rope)
        k = torch.cat((k_up.view(b, t, h, self.nope), k_pe), dim=-1)
        return q, k, v_up.view(b, t, h, self.value)


def keeps_latents_whole(g: TensorGroup) -> bool:
    """torchtitan's MLA at tp > 1: the attention's input gathered once (Shard(1) ->
    Replicate), the down projections replicated on it."""
    return g.sequence_parallel and g.saves_gathered


def _normed(norm: nn.Module | None, latent: torch.Tensor) -> torch.Tensor:
    """A latent through its norm (Megatron builds one with --qk-layernorm), or as it is."""
    return latent if norm is None else norm(latent)


class LatentAttention(nn.Module):
    """MLA: the latents, the up projection, attention, the output projection."""

    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        a = s.arch
        h, heads, nope, rope = a.hidden_size, a.num_heads, s.head_dim, a.qk_rope_head_dim
        value = a.v_head_dim or nope
        self.heads, self.value = heads, value
        self.q_down = nn.Linear(h, a.q_lora_rank, bias=False) if a.q_lora_rank else None
        self.q_norm = s.norm(a.q_lora_rank) if a.q_lora_rank and a.qk_layernorm else None
        self.kv_down = nn.Linear(h, a.kv_lora_rank, bias=False)
        self.k_rope = nn.Linear(h, rope, bias=False)
        self.kv_norm = s.norm(a.kv_lora_rank) if a.qk_layernorm else None
        tables = rotary_tables(a.seq_length, rope, 10000.0) if a.rotary else None
        self.up = UpProjection(q_in=a.q_lora_rank or h, kv_lora=a.kv_lora_rank, heads=heads,
                               nope=nope, rope=rope, value=value, rotary=tables)
        self.core = LatentAttentionCore(unfused=a.unfused_attention)
        self.o = nn.Linear(heads * value, h, bias=False)
        self.rows: ParallelLinears | None = None
        """At tp > 1: the output projection (a policy's `attn_proj`)."""

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor rank's heads; the down projections stay whole."""
        self.heads //= g.size
        self.up.shard(g)
        shard_input(self.o, g)
        self.rows = ParallelLinears(g, (self.o,), row=True)
        if g.sequence_parallel:  # applied to this rank's tokens alone
            mark_partial(self.q_down, self.kv_down, self.k_rope, self.q_norm, self.kv_norm)

    def output_linear(self) -> nn.Module | ParallelLinears:
        """The output projection (Megatron's attn_proj offloads its input)."""
        return self.o if self.rows is None else self.rows

    def input_linears(self) -> list[nn.Module | ParallelLinears]:
        """The projections that read the layer's normed input (Megatron's qkv_linear)."""
        first = self.q_down if self.q_down is not None else self.up.query_linear()
        return [first, self.kv_down, self.k_rope]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.up.tp
        if g is not None and self.up.whole_latents:  # the gradient reduce-scattered back
            x = tokens_in(x, g)
        q_in = x if self.q_down is None else _normed(self.q_norm, self.q_down(x))
        q, k, v = self.up(q_in, _normed(self.kv_norm, self.kv_down(x)), self.k_rope(x))
        b, t = q.shape[:2]  # every token (sequence parallelism: gathered)
        a = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.output_linear()(a.transpose(1, 2).reshape(b, t, self.heads * self.value))
