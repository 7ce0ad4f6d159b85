"""torchtitan's tensor parallelism keeps each column-parallel linear's input gathered: a
block redistributes its sequence-sharded input to Replicate, and DTensor's matmul saves
that whole-sequence tensor for the weight gradient, where Megatron's linears keep the
rank's own tokens and gather again in the backward. The norms keep theirs sharded."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ppsim.config.schema import config_from_dict
from ppsim.costs.layerops import head_activation_bytes
from ppsim.costs.op_sac import op_sac_kept
from ppsim.costs.saved import saved_tensors
from ppsim.job.traffic import regathers

S, B = 4096, 2  # a microbatch's tokens: S x B


def _arch(preset: str, **model: object):
    return config_from_dict({"model": {"preset": preset, "num_layers": 4, "seq_length": S,
                                       "micro_batch_size": B, **model},
                             "pipeline": {"pp": 1, "microbatches": 1}}).model.arch


def _titan(preset: str, **model: object):
    return _arch(preset, fsdp=True, dp=2, **model)


def test_a_dense_layer_keeps_its_blocks_inputs_whole() -> None:
    """Llama 3 8B at tp 4 under torchtitan: every tensor restated by hand."""
    t, h, ffn, w, tok = 4, 4096, 14336, 2, S * B
    q, kv, heads = 32 * 128, 8 * 128, 32
    norm = {"in": tok * h * w / t, "stats": tok * 4 / t, "out": tok * h * w}  # out gathered
    want = 2 * sum(norm.values()) + (tok * (q + 2 * kv + h) * w + 4 * tok * heads) / t \
        + tok * ffn * (2 + 1 + 1) * w / t  # fc1 and fc3 out, the SiLU output, the product
    got = saved_tensors(_titan("llama3-8b", tp=t), "dense")
    assert sum(got.values()) == pytest.approx(want, rel=1e-12)


def test_megatron_keeps_the_ranks_tokens_and_gathers_again() -> None:
    a = _arch("llama3-8b", tp=4)
    got = saved_tensors(a, "dense")
    assert got["norm1.out"] == got["norm2.out"] == pytest.approx(S * B * 4096 * 2 / 4)
    assert regathers(a) and not regathers(_titan("llama3-8b", tp=4))


def test_mlas_latents_run_replicated_on_the_gathered_input() -> None:
    """DeepSeek-V3's low-rank projections, latent norms and rotary key are Replicate
    (deepseek_v3/sharding.py): the up projections' inputs are whole on every rank."""
    tok, w = S * B, 2
    got = saved_tensors(_titan("deepseek-v3", tp=4, ep=1), "dense")
    assert got["q_norm.out"] == pytest.approx(tok * 1536 * w)
    assert got["kv_norm.out"] == pytest.approx(tok * 512 * w)
    assert got["q_norm.stats"] == pytest.approx(tok * 4)
    assert got["norm1.in"] == pytest.approx(tok * 7168 * w / 4)


def test_a_moe_without_expert_parallelism_routes_the_gathered_tokens() -> None:
    tok, w, experts = S * B, 2, 256
    got = saved_tensors(_titan("deepseek-v3", tp=4, ep=1), "moe")
    assert got["norm2.out"] == pytest.approx(tok * 7168 * w)
    assert got["router.probs"] == pytest.approx(2 * tok * experts * 4)
    assert "shared.fc1_in" not in got  # the shared experts take norm2.out, already whole


def test_with_expert_parallelism_only_the_shared_experts_gather() -> None:
    tok, w = S * B, 2
    a = _titan("deepseek-v3", tp=4, ep=4)
    got = saved_tensors(a, "moe")
    assert got["norm2.out"] == pytest.approx(tok * 7168 * w / 4)  # the router's input
    assert got["shared.fc1_in"] == pytest.approx(tok * 7168 * w)
    assert got["router.probs"] == pytest.approx(2 * tok * 256 * 4 / 4)
    assert op_sac_kept(a, "moe")["router.topk"] == pytest.approx(tok * 8 * 12 / 4)


def test_the_output_layer_keeps_its_gathered_input() -> None:
    t, tok, h, w = 4, S * B, 4096, 2
    titan, megatron = _titan("llama3-8b", tp=t), _arch("llama3-8b", tp=t)
    assert head_activation_bytes(titan) - head_activation_bytes(megatron) == \
        pytest.approx(tok * h * w * (1 - 1 / t), abs=1)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(16)
        self.wq = torch.nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wq(self.norm(x))


def _saved_local_shapes(rank: int, port: int, out: dict) -> None:
    """torchtitan's plan on a norm and a linear over two gloo ranks: the local shapes of
    what autograd saves, on rank 0."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    m = _Block()
    parallelize_module(m, init_device_mesh("cpu", (2,)),
                       {"norm": SequenceParallel(),
                        "wq": ColwiseParallel(input_layouts=Shard(1))})
    shapes: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(t.to_local().shape) if hasattr(t, "to_local") else tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(torch.randn(1, 32, 16, requires_grad=True))  # the rank's 32 of 64 tokens
    if rank == 0:
        out["shapes"] = shapes
    dist.destroy_process_group()


def test_dtensors_column_parallel_linear_saves_the_whole_sequence() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_saved_local_shapes, args=(port, out), nprocs=2)
        shapes = list(out["shapes"])
    hidden = [sh for sh in shapes if sh[-1] == 16 and len(sh) > 1]
    assert (64, 16) in hidden  # the linear's input, gathered
    assert all(sh == (1, 32, 16) for sh in hidden if sh != (64, 16))  # the norm's, sharded
