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

from collections.abc import Sequence

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
