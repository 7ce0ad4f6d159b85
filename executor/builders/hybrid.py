"""The hybrid stack a Megatron pattern describes, in plain torch (ppsim.costs.hybrid), and a
GPT model whose layers attend by GatedDeltaNet where linear_attention_freq says.

One module per symbol, each behind its own pre-norm and residual as Megatron's
HybridModel builds them (a GatedDeltaNet decoder layer is two of them, its mixer's and its
MLP or MoE block's, as Megatron's TransformerLayer runs them): Mamba-2 and GatedDeltaNet
from ppsim.executor.builders.ssm, attention, the MLP and the MoE block from
ppsim.executor.builders.llama. MLA and DSA layers ('+', 'D', the dsa variant) and MTP
depths are not built here (the shipped builders build GQA attention only); the cost model
covers them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ppsim.costs.hybrid import parse_pattern
from ppsim.costs.stack import PAIRED_KINDS
from ppsim.errors import UserError
from ppsim.executor.builders.common import MLP, init_normal
from ppsim.executor.builders.llama import Attention, LlamaBuilder, LlamaShape
from ppsim.executor.builders.moe import MoE, init_experts
from ppsim.executor.builders.ssm import GatedDeltaNet, Mamba2
from ppsim.executor.builders.tensor import TensorGroup, mark_partial, sliced

_OUT = ("o", "down", "out_proj")
"""Projections back into the residual stream: GPT-2's scaled init."""


class HybridLayer(nn.Module):
    """One symbol of the pattern: x + mixer(norm(x))."""

    def __init__(self, s: LlamaShape, kind: str) -> None:
        super().__init__()
        a = s.arch
        self.norm = s.norm(a.hidden_size)
        if kind == "mamba":
            self.mixer: nn.Module = Mamba2(a)
        elif kind == "gdn":
            self.mixer = GatedDeltaNet(a)
        elif kind == "attention":
            self.mixer = Attention(s)
        elif kind == "mlp":
            self.mixer = MLP(a.hidden_size, a.ffn_hidden_size, a.gated_mlp,
                             a.swiglu_keeps_silu)
        elif kind == "moe-mlp":
            self.mixer = MoE(s)
        else:
            raise UserError("model.hybrid_layer_pattern", f"the shipped builder has no {kind} "
                            "layer (MLA and DSA are costed, not built)",
                            "use M, G, *, - and E, or a builder of your own (--model)")

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor rank's part of the mixer."""
        self.mixer.shard(g)  # type: ignore[operator]
        if g.sequence_parallel:  # applied to this rank's tokens alone
            mark_partial(self.norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x))


class LinearAttentionLayer(nn.Module):
    """A GPT model's decoder layer with GatedDeltaNet for attention (PAIRED_KINDS):
    x + gdn(norm(x)), then its MLP or MoE block, one layer for the pipeline."""

    def __init__(self, s: LlamaShape, kind: str) -> None:
        super().__init__()
        first, second = PAIRED_KINDS[kind]
        self.mixer_half = HybridLayer(s, first)
        self.mlp_half = HybridLayer(s, second)

    def halves(self) -> tuple[HybridLayer, HybridLayer]:
        return self.mixer_half, self.mlp_half

    def shard(self, g: TensorGroup) -> None:
        for half in self.halves():
            half.shard(g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_half(self.mixer_half(x))


class HybridBuilder(LlamaBuilder):
    """`ModelBuilder` of a hybrid pattern: the Llama builder's embedding, head and data,
    with each layer the pattern's mixer."""

    def __init__(self, shape: LlamaShape) -> None:
        a = shape.arch
        if a.experimental_attention_variant == "dsa":
            raise UserError("model.experimental_attention_variant", "the shipped builder "
                            "has no DeepSeek sparse attention (the cost model prices it)",
                            "drop --experimental-attention-variant dsa to run its MLA, or "
                            "give a builder of your own (--model)")
        if a.mtp_layers or (a.hybrid_layer_pattern
                            and parse_pattern(a.hybrid_layer_pattern).mtp_depths):
            raise UserError("model.hybrid_layer_pattern", "the shipped builder has no MTP",
                            "drop the '/' part to run it (the cost model prices MTP)")
        super().__init__(shape)

    def layer(self, index: int) -> nn.Module:
        kind = self.shape.kinds[index]
        if kind in ("dense", "moe"):  # a GPT model's attention layer among GatedDeltaNet's
            return super().layer(index)
        layer: LinearAttentionLayer | HybridLayer
        if kind in PAIRED_KINDS:
            layer = LinearAttentionLayer(self.shape, kind)
            for half in layer.halves():
                self._init(half)
        else:
            layer = self._init(HybridLayer(self.shape, kind))
        return sliced(layer)

    def _init(self, layer: HybridLayer) -> HybridLayer:
        init_normal(layer, self.num_layers, _OUT)
        with torch.no_grad():
            mixer = layer.mixer
            if isinstance(mixer, (Mamba2, GatedDeltaNet)):
                # Decay rates spread over heads (A in [1, heads]), as Mamba-2 initialises.
                mixer.A_log.copy_(torch.log(torch.arange(1, mixer.A_log.numel() + 1.0)))
                mixer.norm_weight.fill_(1.0)
            if isinstance(mixer, Mamba2):
                mixer.D.fill_(1.0)
            if isinstance(mixer, MoE):
                init_experts(mixer, self.num_layers)
        return layer


def build(fields: dict[str, Any]) -> HybridBuilder:
    """The stack the fields' hybrid_layer_pattern (or attention variant) describes."""
    return HybridBuilder(LlamaShape.from_fields(fields))
