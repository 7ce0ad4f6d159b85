"""The executor's Muon (ppsim.executor.optim.Muon) steps as torch.optim.Muon does, bit for
bit, on wide, tall and square weights; beside AdamW (Optimizers) each keeps its own state:
one momentum a Muon weight, Adam's step and two moments the rest."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ppsim.executor.optim import FusedAdamW, Muon, Optimizers, optimizer  # noqa: E402


def _weights(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g))
            for shape in ((8, 24), (24, 8), (16, 16))]


def _grads(params: list[torch.nn.Parameter], step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_our_muon_steps_as_torchs() -> None:
    ours, theirs = _weights(0), _weights(0)
    mine, reference = Muon(ours, lr=0.02), torch.optim.Muon(theirs, lr=0.02)
    for step in range(3):
        _grads(ours, step)
        _grads(theirs, step)
        mine.step()
        reference.step()
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(mine.state[a]["momentum_buffer"],
                           reference.state[b]["momentum_buffer"])
    assert not torch.equal(ours[0], _weights(0)[0])  # it moved


def test_muon_refuses_what_is_not_a_matrix() -> None:
    with pytest.raises(ValueError, match="2-D"):
        Muon([torch.nn.Parameter(torch.zeros(4))], lr=0.1)


def test_muon_beside_adamw_keeps_each_ones_state() -> None:
    matrices = _weights(1)
    norm = torch.nn.Parameter(torch.ones(8))
    opt = optimizer([*matrices, norm], lr=1e-3, muon=matrices)
    assert isinstance(opt, Optimizers)
    _grads([*matrices, norm], 0)
    opt.step()
    assert set(opt.state[norm]) == {"step", "exp_avg", "exp_avg_sq"}
    assert all(set(opt.state[p]) == {"momentum_buffer"} for p in matrices)
    assert isinstance(optimizer([norm], lr=1e-3), FusedAdamW)
