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
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_attention_math.default,
    torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
    torch.ops.aten.max.default, torch.ops.aten.linear.default, torch.ops.aten.topk.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_to_all_single.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
"""torchtitan's save list as it builds it (b5bcd76, `_get_default_save_ops`: the
partitioner's compute-intensive ops and its extras that torch has without optional
packages), with CPU's FlashAttention op beside CUDA's."""


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


# ------------------------------------------------------------------ DeepSeek's block

D_H, D_HEADS, Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD = 64, 4, 32, 16, 8, 16, 24
"""V as wide as Q and K: FlashAttention's kernel, as torchtitan's attention runs."""
EXPERTS, TOP_K, E_FFN = 4, 2, 24


class TitanMoEBlock(nn.Module):
    """A DeepSeek-V3 block as torchtitan's (models/deepseek_v3/model.py, common/moe.py):
    MLA with wq_a, wq_b, wkv_a, wkv_b, wo; a router's gate, sigmoid scores and top-k; the
    routed experts as grouped matmuls; one shared expert w2(silu(w1(y)) * w3(y))."""

    def __init__(self) -> None:
        super().__init__()
        lin = lambda i, o: nn.Linear(i, o, bias=False)  # noqa: E731
        self.attention_norm, self.ffn_norm = nn.RMSNorm(D_H), nn.RMSNorm(D_H)
        self.q_norm, self.kv_norm = nn.RMSNorm(Q_LORA), nn.RMSNorm(KV_LORA)
        self.wq_a, self.wq_b = lin(D_H, Q_LORA), lin(Q_LORA, D_HEADS * (NOPE + ROPE))
        self.wkv_a = lin(D_H, KV_LORA + ROPE)
        self.wkv_b = lin(KV_LORA, D_HEADS * (NOPE + V_HEAD))
        self.wo = lin(D_HEADS * V_HEAD, D_H)
        self.gate = lin(D_H, EXPERTS)
        self.w13 = nn.Parameter(torch.randn(2, EXPERTS, D_H, E_FFN) / 8)
        self.w2e = nn.Parameter(torch.randn(EXPERTS, E_FFN, D_H) / 8)
        self.w1, self.w3, self.w2 = lin(D_H, E_FFN), lin(D_H, E_FFN), lin(E_FFN, D_H)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(t, D_HEADS, NOPE + ROPE)
        kv, k_pe = self.wkv_a(x).split([KV_LORA, ROPE], dim=-1)
        k_pe = (k_pe * 0.5).unsqueeze(1)  # rotary, elementwise
        kv = self.wkv_b(self.kv_norm(kv)).view(t, D_HEADS, NOPE + V_HEAD)
        k_nope, v = kv.split([NOPE, V_HEAD], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, D_HEADS, -1)], dim=-1)
        per_seq = [z.view(BATCH, SEQ, D_HEADS, -1).transpose(1, 2) for z in (q, k, v)]
        out = F.scaled_dot_product_attention(*per_seq, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(t, D_HEADS * V_HEAD))

    def _moe(self, y: torch.Tensor) -> torch.Tensor:
        scores = torch.sigmoid(self.gate(y).float())
        _, ids = torch.topk(scores, TOP_K, dim=-1)
        weights = scores.gather(-1, ids)
        order = ids.flatten().argsort()
        counts = torch.bincount(ids.flatten(), minlength=EXPERTS)
        offs = counts.cumsum(0).to(torch.int32)
        pairs = y.repeat_interleave(TOP_K, dim=0)[order]
        h = F.silu(torch._grouped_mm(pairs, self.w13[0], offs=offs)) \
            * torch._grouped_mm(pairs, self.w13[1], offs=offs)
        out = torch.zeros_like(pairs).index_copy(0, order,
                                                 torch._grouped_mm(h, self.w2e, offs=offs))
        routed = (out.view(-1, TOP_K, D_H) * weights.unsqueeze(-1).to(out.dtype)).sum(1)
        return routed + self.w2(F.silu(self.w1(y)) * self.w3(y))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.attention_norm(x))
        return x + self._moe(self.ffn_norm(x))


class MoERecorder(Recorder):
    """torchtitan's policy with its default force-recomputed shape, the router's gate
    (force_recompute_mm_shapes_by_fqns ["moe.router.gate"]: never saved, never counted),
    and the grouped matmuls' FLOPs recomputed (not in the save list)."""

    def policy(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in MM_OPS and tuple(args[1].shape) == (D_H, EXPERTS):
            if not ctx.is_recompute:
                (m, k), n = args[0].shape, args[1].shape[1]
                self.recomputed_mm_flops += 2 * m * n * k
            return CheckpointPolicy.PREFER_RECOMPUTE
        if func == torch.ops.aten._grouped_mm.default and not ctx.is_recompute:
            self.recomputed_mm_flops += 2 * args[0].shape[0] * args[1].shape[-1] \
                * args[0].shape[1]
        return super().policy(ctx, func, *args, **kwargs)


def _moe_arch() -> Architecture:
    return Architecture(num_layers=1, layers="moe*1", hidden_size=D_H, num_heads=D_HEADS,
                        num_kv_heads=D_HEADS, head_dim=NOPE, attention="mla",
                        q_lora_rank=Q_LORA, kv_lora_rank=KV_LORA, qk_rope_head_dim=ROPE,
                        v_head_dim=V_HEAD, ffn_hidden_size=E_FFN, num_experts=EXPERTS,
                        top_k=TOP_K, moe_ffn_hidden_size=E_FFN, shared_experts=1,
                        vocab_size=256, seq_length=SEQ, micro_batch_size=BATCH,
                        dtype="fp32", recompute="op-sac")


def _moe_step() -> tuple[TitanMoEBlock, torch.Tensor, MoERecorder]:
    torch.manual_seed(0)
    block, x = TitanMoEBlock(), torch.randn(BATCH * SEQ, D_H, requires_grad=True)
    rec = MoERecorder()
    out = checkpoint(block, x, use_reentrant=False,
                     context_fn=lambda: create_selective_checkpoint_contexts(rec.policy))
    out.square().mean().backward()
    return block, x, rec


def test_op_sac_keeps_what_torch_s_checkpoint_saves_of_a_moe_block() -> None:
    """wq_a's, wkv_a's, wo's and the shared w3's outputs, attention's, top-k's, and the
    block's input: not wq_b, wkv_b, the gate, the grouped experts, w1 or w2."""
    _, x, rec = _moe_step()
    kept = sum(rec.saved.values()) + x.numel() * x.element_size()
    assert kept == sum(op_sac_kept(_moe_arch(), "moe").values())


def test_op_sac_recomputes_a_moe_block_s_matmuls_as_torch_s_checkpoint() -> None:
    """wq_b, wkv_b, the gate, the routed experts whole, the shared w1 and w2."""
    _, _, rec = _moe_step()
    a = _moe_arch()
    again = module_effect(a, "moe", (OP_SAC_MODULE,)).ops_again(layer_ops(a, "moe"))
    assert rec.recomputed_mm_flops == sum(op.flops for op in again if op.shape[0])
