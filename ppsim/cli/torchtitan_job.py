"""A job's shape as torchtitan's config takes it: the fields of its ParallelismConfig,
TrainingConfig and, for AsyncTP (--tp-comm-overlap here), CompileConfig
(torchtitan/config/configs.py), for a job whose replicas shard as torchtitan's do (FSDP).

torchtitan counts its batch in tokens: one microbatch of a data-parallel rank is
num_tokens_per_microbatch_per_dp_rank (micro batch x sequence), a step
num_tokens_per_train_step (global batch x sequence); with pp the rank's microbatches
per gradient-accumulation step are parallelism.num_pp_microbatches (ppsim's
microbatches, so one accumulation step), without it the accumulation steps are the
microbatches.
"""

from __future__ import annotations

from typing import Any

from ppsim.costs.op_sac import OP_SAC
from ppsim.pipeline.exports import TORCHTITAN_HEAD
from ppsim.schedules.generators import TORCH_NAMES

FLOAT8 = f"Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns=['{TORCHTITAN_HEAD}'])"
"""torchtitan's float8 (components/quantization/float8.py): every linear but the output
layer's, as ppsim prices FP8 under FSDP (and as llama3_405b converts them)."""
AC_OF_MODE = {"none": None, "full": "FullAC", OP_SAC: "SelectiveAC"}
"""Recompute modes torchtitan has a policy for (Megatron's selective core-attention
recompute is none of them)."""


def torchtitan_job(shape: Any, problem: Any, gbs: int, fqns: list[list[str]] | None,
                   recompute: str) -> dict[str, Any]:
    """torchtitan's fields for `shape` (ppsim.job.shapes.Shape) of an FSDP job; `fqns`:
    the split's module_fqns_per_model_part (None where torchtitan cannot take it),
    `recompute`: the shape's recompute mode, or "" for a policy torchtitan cannot say.
    `notes` says what torchtitan cannot take, each in a few words."""
    job = problem.hardware.job
    seq = job.shape.seq_length
    copies = job.arch.dp_replicas
    par: dict[str, Any] = {"data_parallel_shard_degree": shape.dp // copies,
                           "tensor_parallel_degree": shape.tp,
                           "context_parallel_degree": shape.cp,
                           "expert_parallel_degree": shape.ep,
                           "pipeline_parallel_degree": shape.pp}
    if copies > 1:
        par["data_parallel_replicate_degree"] = copies
    if job.arch.fsdp_reshard_after_forward != "default":
        par["fsdp_reshard_after_forward"] = job.arch.fsdp_reshard_after_forward
    train: dict[str, Any] = {"num_tokens_per_microbatch_per_dp_rank": shape.mbs * seq,
                             "num_tokens_per_train_step": gbs * seq,
                             "max_context_length": seq}
    if job.arch.fsdp_cpu_offload:
        train["enable_cpu_offload"] = True
    notes = [f"HSDP replicates over dp alone, and {copies} copies do not divide "
             f"dp = {shape.dp}"] if shape.dp % copies else []
    if shape.pp > 1:
        name = TORCH_NAMES.get(problem.schedule.name)
        par["pipeline_parallel_schedule"] = name
        par["module_fqns_per_model_part"] = fqns
        par["num_pp_microbatches"] = shape.microbatches
        if name is None:
            notes.append(f"torch has no {problem.schedule.name} schedule")
        if fqns is None:
            notes.append("torchtitan cannot build this split")
    out: dict[str, Any] = {"parallelism": par, "training": train}
    if shape.cp > 1 and job.arch.cp_comm_type != "p2p":
        notes.append(f"torchtitan's context parallelism is torch's, not Transformer "
                     f"Engine's {job.arch.cp_comm_type}")
    if job.arch.loss_chunks:
        out["loss"] = {"num_chunks": job.arch.loss_chunks}  # ChunkedLossWrapper's
    if job.tp_comm_overlap and shape.tp > 1:  # AsyncTP: torchtitan compiles the model for it
        out["compile"] = {"enable": True, "enable_async_tensor_parallel": True}
    if job.arch.nvfp4:
        notes.append("torchtitan trains in no NVFP4 recipe: the quantization is left out")
    elif job.arch.fp8:
        out["quantization"] = FLOAT8
        if job.arch.fp8_recipe != "rowwise":
            notes.append("torchtitan's Float8LinearConverter scales rowwise; tensorwise "
                         "is torchao's Float8LinearConfig, applied by hand")
    if recompute in AC_OF_MODE:
        out["activation_checkpointing"] = AC_OF_MODE[recompute]
    else:
        notes.append("torchtitan has no form of this memory policy")
    out["notes"] = notes
    return out


def torchtitan_text(fields: dict[str, Any]) -> str:
    """The fields as one line: section, then name=value pairs."""
    parts = []
    for section in ("parallelism", "training", "compile", "loss"):
        if section not in fields:
            continue
        pairs = ", ".join(f"{k}={v!r}" for k, v in fields[section].items()
                          if k != "module_fqns_per_model_part")
        parts.append(f"{section}: {pairs}")
    for key in ("activation_checkpointing", "quantization"):
        if key in fields:
            parts.append(f"{key}: {fields[key]}")
    fqns = fields["parallelism"].get("module_fqns_per_model_part")
    if fqns is not None:
        parts.append(f"module_fqns_per_model_part={fqns!r}")
    text = "; ".join(parts)
    return text + (f" (n/a: {'; '.join(fields['notes'])})" if fields["notes"] else "")
