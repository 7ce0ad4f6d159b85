"""A stage's output once sent: its data freed, its graph kept for the backward.

Megatron's schedules free a stage's output tensor right after sending it
(`deallocate_output_tensor`) and run the backward from it through the autograd
engine directly (`custom_backward`), since the freed tensor's shape no longer matches
the gradient it receives; the runtime does the same (ppsim.executor.runtime), so a
stage keeps its input until its B and not its output.
"""

from __future__ import annotations

import torch


def deallocate_output(y: torch.Tensor) -> None:
    """Free a sent output's data, keeping its autograd graph for the backward (as
    Megatron's `deallocate_output_tensor`): nothing the backward needs is in it (the
    ops that need it saved their own reference), and the send holds its own."""
    if y._base is None and y.grad_fn is not None:
        y.data = torch.empty((1,), device=y.device, dtype=y.dtype)


def backward_from(y: torch.Tensor, grad: torch.Tensor | None) -> None:
    """Backward from `y` with gradient `grad`: the engine directly, as Megatron's
    custom_backward, since a deallocated output's shape no longer matches grad's."""
    grads = (torch.ones_like(y) if grad is None else grad,)
    torch.autograd.Variable._execution_engine.run_backward(  # type: ignore[attr-defined]
        (y,), grads, keep_graph=False, create_graph=False, inputs=(),
        allow_unreachable=True, accumulate_grad=True)
