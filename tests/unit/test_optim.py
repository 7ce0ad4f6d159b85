"""ppsim's fused AdamW steps exactly as torch.optim.AdamW(fused=True), without torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from ppsim.executor.optim import FusedAdamW  # noqa: E402


def _params() -> list:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(7, 5)),
            torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16)),
            torch.nn.Parameter(torch.randn(4))]


def _train(params: list, opt) -> None:
    for it in range(3):
        gen = torch.Generator().manual_seed(it)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        params[2].grad = None  # a parameter without a gradient is left alone
        opt.step()


def test_steps_equal_torchs_fused_adamw_bit_for_bit() -> None:
    ours, theirs = _params(), _params()
    mine = FusedAdamW(ours, lr=1e-2)
    _train(ours, mine)
    ref = torch.optim.AdamW(theirs, lr=1e-2, fused=True)
    _train(theirs, ref)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    assert set(mine.state) == {ours[0], ours[1]}
    for key in ("step", "exp_avg", "exp_avg_sq"):
        got, want = mine.state[ours[0]][key], ref.state[theirs[0]][key]
        assert torch.equal(got, want) and got.dtype == want.dtype


def test_zero_grad_drops_gradients_and_empty_list_is_refused() -> None:
    ps = _params()
    opt = FusedAdamW(ps, lr=1e-3)
    _train(ps, opt)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)
    with pytest.raises(ValueError, match="empty parameter list"):
        FusedAdamW([], lr=1e-3)


def test_a_step_does_not_import_dynamo() -> None:
    code = ("import sys, torch\nfrom ppsim.executor.optim import adamw\n"
            "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
            "o = adamw([p], 1e-3); o.step(); o.zero_grad()\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_measurements_fork_unless_cuda_is_initialised() -> None:
    from ppsim.executor.spawned import start_method

    assert start_method("cpu", cuda_initialized=False) == "fork"
    assert start_method("cpu", cuda_initialized=True) == "spawn"
    assert start_method("cuda", cuda_initialized=False) == "spawn"
