"""The optimizer every engine and the profile use: AdamW, fused.

Fused is torchtitan's default implementation: one kernel over all of a rank's
tensors, so the step costs its bytes rather than a dozen eager ops per tensor
(on this VM's CPU, 1.8 ms instead of 4.9-6.4 ms for a 72-tensor stage of the
tiny GPT). The ppsim engine, the torch.distributed.pipelining peer and
`ppsim profile` all build it here, so engines compare like for like and the
profile times the step the run takes; its state (step, two moments per
tensor) is what the static-bytes accounting counts.

`FusedAdamW` calls the kernel `torch.optim.AdamW(fused=True)` calls, with the
same state and defaults, and steps bit for bit alike (tests/unit). It is ours
rather than torch's class because every `torch.optim.Optimizer` method imports
torch._dynamo on first use: 1.5-3 s of CPU per rank, the largest part of a
small run's start-up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch


class FusedAdamW:
    """AdamW (decoupled weight decay) on torch's fused kernel, torch's defaults."""

    def __init__(self, params: Sequence[torch.nn.Parameter], lr: float, *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.state: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}
        """Per parameter, allocated at its first step: `step`, `exp_avg`, `exp_avg_sq`."""

    def _state(self, p: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        if p not in self.state:
            self.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return self.state[p]

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient, a kernel call per dtype."""
        groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        for p in self.params:
            if p.grad is not None:
                groups.setdefault((p.device, p.dtype), []).append(p)
        for ps in groups.values():
            states = [self._state(p) for p in ps]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(ps, [p.grad for p in ps], [s["exp_avg"] for s in states],
                                [s["exp_avg_sq"] for s in states], [], steps,
                                lr=self.lr, beta1=self.betas[0], beta2=self.betas[1],
                                weight_decay=self.weight_decay, eps=self.eps,
                                amsgrad=False, maximize=False)

    def zero_grad(self) -> None:
        """Drop every gradient (torch's default, set_to_none)."""
        for p in self.params:
            p.grad = None


def adamw(params: Sequence[torch.nn.Parameter], lr: float) -> FusedAdamW:
    """Fused AdamW over `params` (floating point)."""
    return FusedAdamW(params, lr)


NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
"""The quintic Newton-Schulz iteration's coefficients (torch.optim.Muon's default)."""


class Muon:
    """torch.optim.Muon's update on 2-D weights, torch's defaults (momentum 0.95 with
    Nesterov, five quintic Newton-Schulz iterations in bf16, the rate scaled by
    sqrt(max(1, rows / cols)), decoupled weight decay 0.1): ours for the reason
    FusedAdamW is, stepping bit for bit alike (tests/unit/test_executor_muon.py). Its
    state is one momentum a weight."""

    def __init__(self, params: Sequence[torch.nn.Parameter], lr: float, *,
                 weight_decay: float = 0.1, momentum: float = 0.95, ns_steps: int = 5,
                 eps: float = 1e-7) -> None:
        self.params = list(params)
        if any(p.dim() != 2 for p in self.params):
            raise ValueError("Muon steps 2-D weights only")
        self.lr, self.weight_decay, self.momentum = lr, weight_decay, momentum
        self.ns_steps, self.eps = ns_steps, eps
        self.state: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}
        """Per weight, allocated at its first step: `momentum_buffer`."""

    def _orthogonal(self, grad: torch.Tensor) -> torch.Tensor:
        a, b, c = NS_COEFFICIENTS
        x = grad.bfloat16()
        tall = grad.size(0) > grad.size(1)
        x = x.T if tall else x
        x.div_(x.norm().clamp(min=self.eps))
        for _ in range(self.ns_steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        return x.T if tall else x

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            buf = self.state.setdefault(p, {"momentum_buffer": torch.zeros_like(p.grad)})[
                "momentum_buffer"]
            buf.lerp_(p.grad, 1 - self.momentum)
            update = self._orthogonal(p.grad.lerp(buf, self.momentum))
            p.mul_(1 - self.lr * self.weight_decay)
            p.add_(update, alpha=-self.lr * math.sqrt(max(1, p.size(0) / p.size(1))))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class Optimizers:
    """Several optimizers stepped as one (Muon's weights and the rest on AdamW): their
    states side by side."""

    def __init__(self, *parts: FusedAdamW | Muon) -> None:
        self.parts = parts

    @property
    def state(self) -> dict[torch.nn.Parameter, dict[str, torch.Tensor]]:
        return {k: v for part in self.parts for k, v in part.state.items()}

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()


def muon_weights(stages: Iterable[torch.nn.Module]) -> list[torch.nn.Parameter]:
    """The weights Megatron's --optimizer muon steps by Muon: the 2-D ones of the stages'
    decoder layers (ppsim.executor.builders.stage.Stage.layers), not the embedding's,
    the head's or the norms'."""
    return [p for stage in stages for p in stage.layers.parameters() if p.dim() == 2]


def optimizer(params: Sequence[torch.nn.Parameter], lr: float,
              muon: Sequence[torch.nn.Parameter] = ()) -> FusedAdamW | Optimizers:
    """AdamW over `params`, or (`muon` given: the decoder's 2-D weights among them)
    Muon over those and AdamW over the rest, as Megatron's --optimizer muon splits them."""
    if not muon:
        return adamw(params, lr)
    ids = {id(p) for p in muon}
    rest = [p for p in params if id(p) not in ids]
    return Optimizers(*([adamw(rest, lr)] if rest else []), Muon(list(muon), lr))
