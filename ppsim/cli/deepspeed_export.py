"""A planned shape as a DeepSpeed pipeline job: its ds_config.json keys and its
PipelineModule's arguments, the reverse of ppsim.cli.deepspeed_job (each key found by
that module's own translation), for a shape DeepSpeed's pipeline engine runs as ppsim
prices it; `notes` says why where it does not.

DeepSpeed's engine runs one stage a rank in its 1F1B TrainSchedule, with ZeRO-0 or -1
(ZeRO-2 and -3 it refuses under a pipeline), Adam's state on the GPU, and no tensor,
context or expert parallelism of its own: tp is Megatron-DeepSpeed's
(--tensor-model-parallel-size), priced as Megatron's.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ppsim.cli.deepspeed_job import (
    ENGINE_SHAPE,
    PARTITION_KEYS,
    RECOMPUTE_OF_INTERVAL,
    zero_of,
)
from ppsim.errors import UserError
from ppsim.pipeline.exports import DEFAULT_SPECS, deepspeed_boundaries
from ppsim.plan.baselines import deepspeed_splits

INTERVAL_OF_RECOMPUTE = {mode: n for n, mode in RECOMPUTE_OF_INTERVAL.items()}
MEGATRON_ONLY = (("tp_comm_overlap", "--tp-comm-overlap"),
                 ("overlap_grad_reduce", "--overlap-grad-reduce"),
                 ("overlap_param_gather", "--overlap-param-gather"))
"""Megatron's overlaps, which DeepSpeed's engine does not run (its overlap_comm is
taken, not priced)."""


def _refusals(shape: Any, problem: Any, recompute: str) -> list[str]:
    """Why DeepSpeed's pipeline engine cannot run the shape as ppsim prices it."""
    job = problem.hardware.job
    a = job.arch
    checks = (
        (a.fsdp, "the replicas shard as FSDP (ZeRO-3), which DeepSpeed's pipeline "
                 "refuses"),
        (shape.vpp != ENGINE_SHAPE["vpp"], f"DeepSpeed runs one stage a rank, not vpp "
                                           f"{shape.vpp}"),
        (problem.schedule.name != ENGINE_SHAPE["schedule"], f"DeepSpeed's pipeline runs "
                                                            f"1F1B, not {problem.schedule.name}"),
        (shape.cp != ENGINE_SHAPE["cp"], "DeepSpeed has no context parallelism of "
                                         "Megatron's kind"),
        (bool(a.num_experts), "DeepSpeed's MoE is not Megatron's experts"),
        (bool(a.mtp_layers), "DeepSpeed's pipeline has no multi-token prediction"),
        (bool(a.hybrid_layer_pattern or a.experimental_attention_variant),
         "DeepSpeed's pipeline builds no Mamba, GatedDeltaNet or DSA layers"),
        (bool(a.fp8 or a.nvfp4), "DeepSpeed's config trains in no FP8 or FP4 recipe"),
        (a.optimizer != "adam", f"DeepSpeed's config is priced with Adam, not "
                                f"{a.optimizer}"),
        (a.optimizer_cpu_offload or a.precision_aware_optimizer,
         "ZeRO-Offload is not Megatron's host or precision-aware optimizer"),
        (recompute not in INTERVAL_OF_RECOMPUTE, "PipelineModule recomputes every "
         "layer or none (activation_checkpoint_interval 1 or 0), not this memory policy"))
    notes = [why for bad, why in checks if bad]
    notes += [f"DeepSpeed runs no {flag}" for attr, flag in MEGATRON_ONLY
              if getattr(job, attr)]
    if zero_of(a.dtype, a.distributed_optimizer, a.grad_reduce_in_bf16) is None:
        notes.append(f"no ZeRO stage keeps the optimizer as this shape does "
                     f"({'sharded' if a.distributed_optimizer else 'whole'}, "
                     f"{'bf16' if a.grad_reduce_in_bf16 else 'fp32'} gradients, "
                     f"{a.dtype} training)")
    return notes


def _config(shape: Any, arch: Any, gbs: int, recompute: str) -> dict[str, Any]:
    """ds_config.json's keys, each read back by ppsim.cli.deepspeed_config."""
    zero = zero_of(arch.dtype, arch.distributed_optimizer, arch.grad_reduce_in_bf16)
    assert zero is not None  # refused above
    cfg: dict[str, Any] = {"train_batch_size": gbs,
                           "train_micro_batch_size_per_gpu": shape.mbs,
                           "gradient_accumulation_steps": shape.microbatches}
    if arch.dtype != "fp32":
        cfg[arch.dtype] = {"enabled": True}
    cfg["zero_optimization"] = {"stage": zero.zero_stage}
    if zero.grad_accum_dtype is not None:
        cfg["data_types"] = {"grad_accum_dtype": zero.grad_accum_dtype}
    cfg["pipeline"] = {"activation_checkpoint_interval": INTERVAL_OF_RECOMPUTE[recompute]}
    return cfg


def _module(problem: Any) -> dict[str, Any]:
    """PipelineModule's arguments: its own partition_method where that is the planned
    split, else the planned split's boundaries over [embedding, layers..., head]."""
    split = problem.split
    out: dict[str, Any] = {"num_stages": split.pp}
    for fw in deepspeed_splits(problem.costs, split.pp, split.vpp, DEFAULT_SPECS):
        if fw.counts is not None and tuple(fw.counts) == tuple(split.counts):
            method = next(m for m, key in PARTITION_KEYS.items() if key == fw.key)
            return {**out, "partition_method": method}
    return {**out, "boundaries": deepspeed_boundaries(split, DEFAULT_SPECS)}


def deepspeed_job(shape: Any, problem: Any, gbs: int, recompute: str) -> dict[str, Any]:
    """`shape` (ppsim.job.shapes.Shape) as `{config, pipeline_module,
    megatron_deepspeed_args, notes}`; `recompute`: its global recompute mode ("" for a
    policy of another form). Where `notes` is not empty, the rest is null."""
    notes = _refusals(shape, problem, recompute)
    if not notes:
        try:
            module = _module(problem)
        except UserError as exc:  # a split DeepSpeed cannot partition
            notes.append(exc.problem)
    if notes:
        return {"config": None, "pipeline_module": None, "megatron_deepspeed_args": None,
                "notes": notes}
    arch = problem.hardware.job.arch
    tp = ["--tensor-model-parallel-size", str(shape.tp)]
    tp += ["--sequence-parallel"] * arch.sequence_parallel
    return {"config": _config(shape, arch, gbs, recompute), "pipeline_module": module,
            "megatron_deepspeed_args": shlex.join(tp) if shape.tp > 1 else None,
            "notes": []}


def deepspeed_text(fields: dict[str, Any]) -> str:
    """The fields as one line: the ds_config JSON, then PipelineModule's arguments."""
    if fields["notes"]:
        return f"n/a ({'; '.join(fields['notes'])})"
    module = ", ".join(f"{k}={v!r}" for k, v in fields["pipeline_module"].items())
    text = f"ds_config {json.dumps(fields['config'])}; PipelineModule({module})"
    tp = fields["megatron_deepspeed_args"]
    return text + (f"; Megatron-DeepSpeed: {tp}" if tp else "")
