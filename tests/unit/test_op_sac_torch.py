"""op-sac against torch's own selective checkpointing: a Llama block built as torchtitan
builds it, checkpointed with torchtitan's policy through torch.utils.checkpoint, on CPU.
What the policy saves and which matmuls it recomputes are read from torch's dispatch, not
from ppsim, and set against ppsim's op-sac bytes and repeated work."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch.partitioners import get_default_op_list
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import layer_ops
from ppsim.costs.modules import module_effect
from ppsim.costs.op_sac import OP_SAC_MODULE, op_sac_kept

H, HEADS, KV, FFN, SEQ, BATCH = 64, 4, 2, 160, 32, 2
HEAD_DIM = H // HEADS

MM_OPS = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
SAVED = {op.default for op in get_default_op_list().compute_intensive_ops} | {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, *MM_OPS}
"""torchtitan's save list as it builds it (b5bcd76, `_get_default_save_ops`: the
partitioner's compute-intensive ops, linear among its extras), with CPU's FlashAttention
op in the place of CUDA's."""


class TitanBlock(nn.Module):
    """A Llama block as torchtitan's (models/common: fused wqkv, no biases, RMSNorm, rotary
    by complex product, SDPA, SwiGLU as w2(silu(w1(x)) * w3(x)))."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(H), nn.RMSNorm(H)
        self.wqkv = nn.Linear(H, (HEADS + 2 * KV) * HEAD_DIM, bias=False)
        self.wo = nn.Linear(H, H, bias=False)
        self.w1, self.w3 = nn.Linear(H, FFN, bias=False), nn.Linear(H, FFN, bias=False)
        self.w2 = nn.Linear(FFN, H, bias=False)
        angles = torch.outer(torch.arange(SEQ), torch.rand(HEAD_DIM // 2))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles))

    def _rotary(self, x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * self.freqs[:, None, :]).flatten(3).type_as(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.wqkv(self.attention_norm(x)).view(b, s, HEADS + 2 * KV, HEAD_DIM)
        q, k, v = qkv.split([HEADS, KV, KV], dim=2)
        q, k = self._rotary(q), self._rotary(k)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True,
                                             enable_gqa=True)
        x = x + self.wo(out.transpose(1, 2).reshape(b, s, H))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Recorder:
    """torchtitan's SelectiveAC policy (every second matmul recomputed, counted per block
    forward), recording what it saves and which matmuls it recomputes."""

    def __init__(self) -> None:
        self.saved: dict[int, int] = {}
        self.recomputed_mm_flops = 0
        self.count = {"forward": 0, "recompute": 0}

    def policy(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in MM_OPS:
            self.count[mode] += 1
        save = func in SAVED and not (func in MM_OPS and self.count[mode] % 2 == 0)
        if not ctx.is_recompute:
            outs = ctx.op_output if isinstance(ctx.op_output, tuple) else (ctx.op_output,)
            if save:
                for t in (o for o in outs if isinstance(o, torch.Tensor)):
                    self.saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            elif func in MM_OPS:
                (m, k), n = args[0].shape, args[1].shape[1]
                self.recomputed_mm_flops += 2 * m * n * k
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


def _arch() -> Architecture:
    return Architecture(num_layers=1, hidden_size=H, num_heads=HEADS, num_kv_heads=KV,
                        ffn_hidden_size=FFN, vocab_size=256, seq_length=SEQ,
                        micro_batch_size=BATCH, dtype="fp32", recompute="op-sac")


def _checkpointed_step(block: TitanBlock, x: torch.Tensor) -> Recorder:
    rec = Recorder()
    out = checkpoint(block, x, use_reentrant=False,
                     context_fn=lambda: create_selective_checkpoint_contexts(rec.policy))
    out.square().mean().backward()
    return rec


def test_op_sac_keeps_what_torch_s_checkpoint_saves() -> None:
    torch.manual_seed(0)
    block, x = TitanBlock(), torch.randn(BATCH, SEQ, H, requires_grad=True)
    rec = _checkpointed_step(block, x)
    kept = sum(rec.saved.values()) + x.numel() * x.element_size()  # and the block's input
    assert kept == sum(op_sac_kept(_arch()).values())


def test_op_sac_recomputes_the_matmuls_torch_s_checkpoint_recomputes() -> None:
    """wo and w3: the matmul work ppsim's op-sac backward runs again."""
    torch.manual_seed(0)
    block, x = TitanBlock(), torch.randn(BATCH, SEQ, H, requires_grad=True)
    rec = _checkpointed_step(block, x)
    a = _arch()
    ops = layer_ops(a, "dense")
    again = module_effect(a, "dense", (OP_SAC_MODULE,)).ops_again(ops)
    assert rec.recomputed_mm_flops == sum(op.flops for op in again if op.shape[0])
    assert rec.recomputed_mm_flops == 2 * BATCH * SEQ * H * (H + FFN)


def test_the_checkpointed_block_trains_as_the_plain_one() -> None:
    """The policy is one torch runs: the gradients equal the uncheckpointed block's."""
    torch.manual_seed(0)
    block, x = TitanBlock(), torch.randn(BATCH, SEQ, H, requires_grad=True)
    _checkpointed_step(block, x)
    sac = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    block(x).square().mean().backward()
    for got, want in zip(sac, (p.grad for p in block.parameters()), strict=True):
        torch.testing.assert_close(got, want)
