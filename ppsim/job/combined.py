"""Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm): which jobs may run it.

Under the flag Megatron runs each steady-phase forward beside the backward of another
microbatch, layer by layer, so the expert-parallel all-to-alls of each run behind the
other's compute (megatron/core/pipeline_parallel/combined_1f1b.py); the schedule gets
one more warm-up forward per rank (ppsim.schedules.generators). TransformerConfig
asserts what it needs; ppsim refuses the same jobs with Megatron's own words.
"""

from __future__ import annotations

from typing import Any

from ppsim.costs.choices import MEGATRON_FSDP_FLAGS
from ppsim.errors import UserError
from ppsim.policy.model import memory_policy

FLAG = "pipeline.overlap_moe_expert_parallel_comm"
DROP = "or drop --overlap-moe-expert-parallel-comm"


def check(cfg: Any) -> None:
    """UserError, naming the field, for a job Megatron's combined 1F1B does not run, its
    parallel sizes aside (`plan --gpus` searches them: check_shape)."""
    p = cfg.pipeline
    if p.delay_wgrad_compute and not p.overlap_moe_expert_parallel_comm:
        raise UserError("pipeline.delay_wgrad_compute", "overlap_moe_expert_parallel_comm "
                        "must be enabled when enabling delay_wgrad_compute",
                        "add --overlap-moe-expert-parallel-comm, or drop "
                        "--delay-wgrad-compute")
    if not p.overlap_moe_expert_parallel_comm:
        return
    a = getattr(cfg.model, "arch", None)
    if a is None or not a.num_experts:
        raise UserError(FLAG, "overlaps the all-to-alls of a model with experts",
                        f"configure a MoE transformer, {DROP}")
    if a.torchtitan_fsdp:
        raise UserError(FLAG, "is Megatron's combined 1F1B; torchtitan (--fsdp) has none",
                        f"drop --fsdp, {DROP}")
    if a.fsdp:  # Megatron-FSDP runs it; its gathers inside the pairs are not priced
        flag = MEGATRON_FSDP_FLAGS[a.fsdp_framework]
        raise UserError(FLAG, f"beside Megatron's {flag} is not priced (each layer's "
                        "gathers and reduce-scatters inside the overlapped pairs)",
                        f"drop {flag}, {DROP}")
    if p.actions_csv:
        raise UserError(FLAG, "runs Megatron's own combined order, not a given actions CSV",
                        f"drop actions_csv, {DROP}")
    if a.recompute == "full":
        raise UserError("model.recompute", "disable full recomputation when enabling "
                        "overlap_moe_expert_parallel_comm", f"use selective or none, {DROP}")
    _check_memory(cfg.memory)
    if a.dtype not in ("bf16", "fp16"):
        raise UserError("model.dtype", "overlap_moe_expert_parallel_comm is only supported "
                        "with bf16 or fp16 model", f"train in bf16, {DROP}")
    if p.moe_shared_expert_overlap:
        raise UserError("pipeline.moe_shared_expert_overlap", "disable "
                        "moe_shared_expert_overlap when enabling "
                        "overlap_moe_expert_parallel_comm",
                        f"drop --moe-shared-expert-overlap, {DROP}")
    if a.mtp_layers > 1:
        raise UserError("model.mtp_layers", "MTP supports at most one layer when enabling "
                        "overlap_moe_expert_parallel_comm.", f"give at most 1, {DROP}")


def check_shape(cfg: Any) -> None:
    """The expert-parallel size of a job under the flag (its schedule and chunks are
    ppsim.schedules.generators.build_schedule's to check)."""
    if cfg.pipeline.overlap_moe_expert_parallel_comm and cfg.model.arch.ep <= 1:
        raise UserError("model.ep", "overlap_moe_expert_parallel_comm is only supported "
                        "with expert model parallelism",
                        f"set ep > 1 (--expert-model-parallel-size), {DROP}")


def _check_memory(memory: dict[str, Any] | None) -> None:
    """A [memory] policy may not recompute whole layers or the MoE block."""
    if memory is None:
        return
    policy = memory_policy(memory, "none")
    for where, p in (("memory", policy.default),
                     *((f"memory.stage[{i}]", q) for i, q in policy.stages)):
        if p.recompute_layers:
            raise UserError(f"{where}.recompute_layers", "recompute_num_layers must be None "
                            "when enabling overlap_moe_expert_parallel_comm",
                            f"give 0 (no --recompute-num-layers), {DROP}")
        if "moe" in p.recompute_modules:
            raise UserError(f"{where}.recompute_modules", "disable moe in recompute_modules "
                            "when enabling overlap_moe_expert_parallel_comm",
                            f"recompute moe_act instead, {DROP}")


def unpaired_note(schedule: Any) -> str | None:
    """A line when the combined order pairs nothing on some ranks: their warm-up runs
    every forward (too few microbatches), so the overlap hides nothing there."""
    if not schedule.pairs:
        return None
    idle = [r for r, pairs in enumerate(schedule.pairs) if not pairs]
    if not idle:
        return None
    if len(idle) == 1:
        ranks = f"rank {idle[0]}"
    elif idle == list(range(idle[0], idle[-1] + 1)):
        ranks = f"ranks {idle[0]}-{idle[-1]}"
    else:
        ranks = "ranks " + ", ".join(map(str, idle))
    return (f"note: the combined 1F1B pairs nothing on {ranks}: the warm-up runs every "
            "forward there, so no all-to-all hides (more microbatches let it overlap)")
