"""The single-process reference: the whole model, the same microbatches, one backward.

A pipeline run must reproduce its loss and gradients (to float32 tolerance)
whatever the split and schedule; the tests compare against this.
"""

from __future__ import annotations

import torch

from executor.model import GPTShape, full_model, microbatch, stage_loss


def reference_step(shape: GPTShape, microbatches: int, seed: int = 0,
                   iteration: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, gradient by parameter name) of one iteration on one process."""
    model = full_model(shape, seed)
    total = 0.0
    for i in range(microbatches):
        ids, targets = microbatch(shape, seed, iteration, i)
        loss = stage_loss(model(ids), targets) / microbatches
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters()
                   if p.grad is not None}
