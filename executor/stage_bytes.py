"""Per virtual stage, the bytes the executor keeps for one microbatch against the cost
model's: after F until B (what autograd saves, the input the runtime holds) and, with
a split backward, after B until W (what the deferred weight gradients queue).

The runtime counts the same way (ppsim.executor.runtime: `saved_bytes` over a stage's
forward, its input held until the B, a sent output freed); this runs the stages of a
configuration one after another in one process, so the per-stage causes of a peak gap
show without a launch (benchmarks/bench_executor_stage_bytes.py, its unit test).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppsim.config.schema import Config
from ppsim.executor.builders import DEFAULT_BUILDER, load_builder
from ppsim.executor.builders.deferral import WeightGradStore, defer_linears
from ppsim.executor.builders.policy import apply_policy
from ppsim.executor.builders.stage import build_stage, saved_bytes
from ppsim.pipeline.problem import build_problem
from ppsim.sim.copies import resident_bytes


@dataclass(kw_only=True)
class StageBytes:
    """One virtual stage's bytes per microbatch, executor and model."""

    stage: int
    """Virtual stage index."""
    rank: int
    """Pipeline rank that runs it."""
    kept: int
    """Executor: bytes kept on the device from the F to the B."""
    model_kept: int
    """Model: what the stage's F allocates in the simulator (`resident_bytes`)."""
    weight_grad: int
    """Executor: bytes the deferred weight gradients keep from the B to the W."""
    model_weight_grad: int
    """Model: the stage's `weight_grad_bytes`."""


def stage_bytes(cfg: Config) -> list[StageBytes]:
    """Every virtual stage of `cfg` (built-in builder), microbatch 0, in stage order."""
    p = build_problem(cfg)
    b = load_builder(DEFAULT_BUILDER, cfg.model.fields())
    ids, target = b.microbatch(0, 0, 0)
    x: torch.Tensor | None = None
    out = []
    WeightGradStore.reset()
    WeightGradStore.enabled = True
    try:
        for st in p.split.stages:
            mod = build_stage(b, st, 0, "none").to(b.dtype)
            defer_linears(mod)
            if p.memory is not None:
                apply_policy(mod.layers, p.memory.policies[st.index])
            params = {t.untyped_storage().data_ptr() for t in [*mod.parameters(), *mod.buffers()]}
            inp = ids if x is None else x.detach().requires_grad_(True)
            with saved_bytes(params) as seen:
                y = mod(inp)
                if st.has_head:  # the loss keeps what its backward needs
                    y = b.loss(y, target)
            if x is not None:  # the input the runtime holds until the B
                seen[inp.untyped_storage().data_ptr()] = inp.untyped_storage().nbytes()
            WeightGradStore.deferring, WeightGradStore.key = True, (st.index, 0)
            torch.autograd.backward(y, None if st.has_head else torch.ones_like(y))
            WeightGradStore.deferring = False
            c = p.stage_costs[st.index]
            out.append(StageBytes(stage=st.index, rank=p.schedule.stage_rank(st.index),
                                  kept=sum(seen.values()), model_kept=resident_bytes(c),
                                  weight_grad=WeightGradStore.held_bytes((st.index, 0)),
                                  model_weight_grad=c.weight_grad_bytes))
            x = None if st.has_head else y.detach()
    finally:
        WeightGradStore.reset()
    return out
