"""The single-process reference: the whole model, the same microbatches, one backward.

A pipeline run must reproduce its loss and gradients (to float32 tolerance)
whatever the split, schedule, recompute mode and data-parallel degree; the
tests compare against this. With dp replicas of m microbatches each, the
global batch is the dp * m microbatches the replicas draw (replica r's
microbatch i is index r * m + i), and the loss is their mean. A tied model's
head is its embedding's table here (ppsim.executor.builders.tied).
"""

from __future__ import annotations

import torch

from ppsim.executor.builders import ModelBuilder
from ppsim.executor.builders.gpt import GPTBuilder, GPTShape
from ppsim.executor.builders.stage import Stage, full_model
from ppsim.executor.optim import adamw


def _iteration(model: Stage, builder: ModelBuilder, microbatches: int, seed: int,
               iteration: int) -> float:
    """One iteration's loss, its gradients accumulated into `model`'s."""
    total = 0.0
    for i in range(microbatches):
        ids, targets = builder.microbatch(seed, iteration, i)
        loss = builder.loss(model(ids), targets) / microbatches
        loss.backward()
        total += loss.item()
    return total


def reference_step(builder: ModelBuilder | GPTShape, microbatches: int, seed: int = 0,
                   iteration: int = 0, recompute: str = "none"
                   ) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, gradient by parameter name) of one iteration of `microbatches` on one process
    (a GPTShape, as older callers pass, means the built-in GPT)."""
    if isinstance(builder, GPTShape):
        builder = GPTBuilder(builder)
    model = full_model(builder, seed, recompute).to(dtype=builder.dtype)
    total = _iteration(model, builder, microbatches, seed, iteration)
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters()
                   if p.grad is not None}


def reference_losses(builder: ModelBuilder, microbatches: int, iterations: int,
                     lr: float = 1e-3, seed: int = 0) -> tuple[list[float], Stage]:
    """Each iteration's loss of `iterations` trained on one process with the run's AdamW
    (ppsim.executor.optim), and the model after them."""
    model = full_model(builder, seed).to(dtype=builder.dtype)
    opt = adamw(list(model.parameters()), lr)
    losses = []
    for it in range(iterations):
        losses.append(_iteration(model, builder, microbatches, seed, it))
        opt.step()
        opt.zero_grad()
    return losses, model
