"""ppsim.executor.dataparallel on one process (a gloo group of one): the distributed
optimizer's (and FSDP's) flat buffers, padding and fp32 master copy step as AdamW on the
whole.
Two replicas for real: tests/e2e/test_distributed_optimizer.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from ppsim.executor.builders.stage import tensor_bytes  # noqa: E402
from ppsim.executor.dataparallel import (  # noqa: E402
    FullyShardedPipelined,
    Replicated,
    Sharded,
)


def _params(dtype: torch.dtype) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(shape, generator=g).to(dtype)) for shape in
            ((3, 5), (7,), (2, 2, 3))]


def _train(dp, params: list[nn.Parameter], steps: int = 3) -> list[torch.Tensor]:
    for i in range(steps):
        for p in params:
            p.grad.copy_(torch.full_like(p, 0.1 * (i + 1)) + p.detach() * 0.5)
        dp.reduce()
        dp.step()
        if dp.gathers:
            dp.gather()
    return [p.detach().clone() for p in params]


def test_sharded_fp32_steps_bit_for_bit_as_replicated(group) -> None:
    ddp_params = _params(torch.float32)
    want = _train(Replicated(ddp_params, torch.device("cpu"), 1e-2, group, 1), ddp_params)
    params = _params(torch.float32)
    sharded = Sharded(params, torch.device("cpu"), 1e-2, group, 1, 0)
    got = _train(sharded, params)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert sharded.weights.numel() == sum(p.numel() for p in params)
    assert all(p.untyped_storage().data_ptr() == sharded.weights.untyped_storage().data_ptr()
               for p in params)


def test_bf16_weights_step_from_an_fp32_master(group) -> None:
    """A bf16 model's shard steps an fp32 master copy, rounded to bf16 after each step:
    the weights are torch's AdamW on fp32 weights, rounded."""
    params = _params(torch.bfloat16)
    master = [nn.Parameter(p.detach().float()) for p in params]
    sharded = Sharded(params, torch.device("cpu"), 1e-4, group, 1, 0)
    assert len(sharded.static_tensors()) > 2 and sharded.main.dtype == torch.float32
    ref = torch.optim.AdamW(master, lr=1e-4)
    for i in range(3):
        for p, m in zip(params, master, strict=True):
            p.grad.copy_(torch.full_like(p, 0.1 * (i + 1)))
            m.grad = p.grad.float()
        sharded.reduce()
        sharded.step()
        sharded.gather()
        ref.step()
    for p, m in zip(params, master, strict=True):
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
    start = _params(torch.bfloat16)  # the updates did not round away
    assert not all(torch.equal(a.detach(), b.detach()) for a, b in zip(params, start,
                                                                       strict=True))


def test_fsdp_steps_bit_for_bit_as_replicated_from_a_shard_of_its_own(group) -> None:
    """torchtitan's FSDP (pipelined): the fp32 shard is a tensor of its own, not a view of
    the gathered weights, and the reduced gradient's shard is kept; the weights step as
    DDP's, and the state holds the fp32 weights, their gradients and Adam's moments
    beside the whole weights and gradients (ppsim.job.fsdp: 16 / dp + 8 bytes)."""
    ddp_params = _params(torch.float32)
    want = _train(Replicated(ddp_params, torch.device("cpu"), 1e-2, group, 1), ddp_params)
    params = _params(torch.float32)
    fsdp = FullyShardedPipelined(params, torch.device("cpu"), 1e-2, group, 1, 0)
    assert fsdp.main.data_ptr() != fsdp.weights.data_ptr()
    got = _train(fsdp, params)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    n = sum(p.numel() for p in params)
    step_counts = 4  # Adam's one step count, a scalar
    assert tensor_bytes(fsdp.static_tensors()) == (4 + 4 + 16) * n + step_counts
