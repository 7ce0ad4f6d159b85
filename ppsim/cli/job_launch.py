"""A planned shape as its launch: Megatron's arguments, torchtitan's config fields for
a job that shards as torchtitan does, a DeepSpeed pipeline job's config (`plan --gpus`)."""

from __future__ import annotations

import shlex
from typing import Any

from ppsim.cli.deepspeed_export import deepspeed_job
from ppsim.cli.megatron_args import fusion_args, optimizer_args, parallel_args, precision_args
from ppsim.cli.torchtitan_job import torchtitan_job
from ppsim.costs.choices import RECOMPUTE
from ppsim.job.policy_search import mode_flags
from ppsim.job.ranks import DEFAULT_ORDER, TP_PP_DP_ORDER, parse_order
from ppsim.job.search import ShapeResult
from ppsim.pipeline.hybrid_exports import exports_of
from ppsim.policy.report import policy_flags


def shape_exports(r: ShapeResult) -> dict[str, Any]:
    """Every export of the shape's planned split (ppsim.pipeline.hybrid_exports)."""
    p = r.problem
    return exports_of(p.pattern, p.split, p.schedule.microbatch_group)


def _policy_flags(r: ShapeResult) -> list[str] | None:
    """The shape's memory policy as Megatron's flags: the one the search chose, else the
    configured [memory] policy or recompute mode; None when Megatron cannot say it."""
    if r.policy:
        return None if r.policy_flags is None else shlex.split(r.policy_flags)
    p = r.problem
    if p.memory is None:
        assert p.hardware.job is not None  # a job's shape is a transformer model's
        flags = mode_flags(p, p.hardware.job.arch.recompute)
        return None if flags is None else shlex.split(flags)
    return policy_flags(p, p.memory.policies).megatron_flags


def job_flags(r: ShapeResult, gbs: int) -> str | None:
    """The shape as Megatron's arguments: parallel sizes, the split, the batch, the memory
    policy, the precision and the overlaps (ppsim reads them back, with --gpus for the
    world size). None when Megatron cannot build the split or run the policy."""
    split, policy = shape_exports(r)["megatron_flags"], _policy_flags(r)
    job = r.problem.hardware.job
    # A torchtitan job launches with its own fields, not Megatron's arguments.
    if split is None or policy is None or job is None or job.arch.torchtitan_fsdp:
        return None
    order = parse_order(job.shape.rank_order)
    if order not in (parse_order(DEFAULT_ORDER), parse_order(TP_PP_DP_ORDER)):
        return None  # Megatron's launch arguments select only these two
    s = r.shape
    dispatcher = job.moe_token_dispatcher_type if job.arch.num_experts else "alltoall"
    out = parallel_args(s.tp, s.cp, s.ep, dispatcher, job.arch.cp_comm_type,
                        job.arch.cp_a2a_size, s.etp) + shlex.split(split)
    # Megatron requires the sequence length; read back without it, a preset's would stand
    out += ["--seq-length", str(job.arch.seq_length), "--micro-batch-size", str(s.mbs),
            "--global-batch-size", str(gbs), *policy]
    out += optimizer_args(job.arch) + precision_args(job.arch)
    out += fusion_args(job.arch)
    out += ["--use-tp-pp-dp-mapping"] * (order == parse_order(TP_PP_DP_ORDER))
    for size, flag in ((job.ddp_bucket_size, "--ddp-bucket-size"),
                       (job.ddp_num_buckets, "--ddp-num-buckets"),
                       (job.flex_dispatcher_num_sms, "--moe-flex-dispatcher-num-sms")):
        out += [flag, str(size)] if size is not None else []
    for on, flag in ((job.tp_comm_overlap, "--tp-comm-overlap"),
                     (job.overlap_grad_reduce, "--overlap-grad-reduce"),
                     (job.moe_shared_expert_overlap, "--moe-shared-expert-overlap"),
                     (job.overlap_moe_expert_parallel_comm,
                      "--overlap-moe-expert-parallel-comm"),
                     (job.delay_wgrad_compute, "--delay-wgrad-compute"),
                     (job.overlap_param_gather, "--overlap-param-gather"),
                     (job.overlap_param_gather_with_optimizer_step,
                      "--overlap-param-gather-with-optimizer-step")):
        out += [flag] * on
    # Megatron-LM runs it with the legacy checkpoints alone (arguments.py: use_dist_ckpt)
    out += ["--ckpt-format", "torch"] * job.overlap_param_gather_with_optimizer_step
    return shlex.join(out)


def recompute_mode(r: ShapeResult) -> str:
    """The shape's global recompute mode; "" for a per-module or per-stage policy."""
    if r.policy:
        return r.policy if r.policy in RECOMPUTE else ""
    p = r.problem
    assert p.hardware.job is not None  # a job's shape is a transformer model's
    return p.hardware.job.arch.recompute if p.memory is None else ""


def torchtitan_fields(r: ShapeResult, gbs: int) -> dict[str, Any] | None:
    """The shape as torchtitan's config fields, for a job that shards as torchtitan does
    (FSDP); None otherwise."""
    job = r.problem.hardware.job
    if job is None or not job.arch.torchtitan_fsdp:
        return None
    return torchtitan_job(r.shape, r.problem, gbs,
                          shape_exports(r)["torchtitan_module_fqns_per_model_part"],
                          recompute_mode(r))


def deepspeed_fields(r: ShapeResult, gbs: int) -> dict[str, Any]:
    """The shape as a DeepSpeed pipeline job (ppsim.cli.deepspeed_export)."""
    return deepspeed_job(r.shape, r.problem, gbs, recompute_mode(r))
