"""The single-process reference: the whole model, the same microbatches, one backward.

A pipeline run must reproduce its loss and gradients (to float32 tolerance)
whatever the split, schedule, recompute mode and data-parallel degree; the
tests compare against this. With dp replicas of m microbatches each, the
global batch is the dp * m microbatches the replicas draw (replica r's
microbatch i is index r * m + i), and the loss is their mean.
"""

from __future__ import annotations

import torch

from ppsim.executor.builders import ModelBuilder
from ppsim.executor.builders.gpt import GPTBuilder, GPTShape
from ppsim.executor.builders.stage import full_model


def reference_step(builder: ModelBuilder | GPTShape, microbatches: int, seed: int = 0,
                   iteration: int = 0, recompute: str = "none"
                   ) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, gradient by parameter name) of one iteration of `microbatches` on one process
    (a GPTShape, as older callers pass, means the built-in GPT)."""
    if isinstance(builder, GPTShape):
        builder = GPTBuilder(builder)
    model = full_model(builder, seed, recompute).to(dtype=builder.dtype)
    total = 0.0
    for i in range(microbatches):
        ids, targets = builder.microbatch(seed, iteration, i)
        loss = builder.loss(model(ids), targets) / microbatches
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters()
                   if p.grad is not None}
