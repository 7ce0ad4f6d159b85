"""A DeepSpeed job as ppsim's own settings: the config's keys (ppsim.cli.deepspeed_config)
and the PipelineModule's arguments, each translated to the flag that prices the same
thing, so `--deepspeed-config ds.json` simulates as those flags do.

- bf16 / fp16 enabled: --bf16 / --fp16 (neither: the model trains in fp32);
- zero_optimization.stage 1: --use-distributed-optimizer, the gradients kept in the
  training dtype (--grad-reduce-in-bf16 for bf16); stage 0: no sharding, but bf16 under
  a pipeline is DeepSpeed's BF16_Optimizer, which shards the fp32 master weights and
  Adam's moments over dp as stage 1 does and keeps fp32 gradients (data_types.
  grad_accum_dtype: bf16 keeps bf16 ones); stages 2 and 3 refused;
- the batch triple: --micro-batch-size, --microbatches (the accumulation steps),
  --global-batch-size, checked by DeepSpeed's rule at the job's dp (deepspeed_batch);
- activation_checkpoint_interval 1: --recompute full; 0: --recompute none;
- --partition-method parameters|uniform: DeepSpeed's split (ppsim.plan.baselines).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ppsim.cli.deepspeed_batch import BatchTriple, deepspeed_batch
from ppsim.cli.deepspeed_config import FLAG, ROOT, DeepSpeedJob, read_deepspeed_config
from ppsim.config import validate
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import SPLIT_KEYS, Config
from ppsim.errors import UserError
from ppsim.pipeline.exports import parse_deepspeed_specs
from ppsim.pipeline.problem import model_costs
from ppsim.plan.baselines import deepspeed_splits

INTERVAL_FLAG = "--activation-checkpoint-interval"
RECOMPUTE_OF_INTERVAL = {0: "none", 1: "full"}
"""PipelineModule's intervals ppsim prices: none, or every layer recomputed alone."""
ENGINE_SHAPE = {"cp": 1, "vpp": 1, "schedule": "1f1b"}
"""What DeepSpeed's pipeline engine runs: no context parallelism, one stage a rank, 1F1B
(the job search holds these; the export is n/a for a shape without them)."""
RECOMPUTE_DESTS = ("recompute", "recompute_granularity", "recompute_activations",
                   "moe_layer_recompute", "recompute_modules", "recompute_num_layers")
"""The flags that say what a Megatron(-DeepSpeed) line recomputes."""
PARTITION_KEYS = {"parameters": "deepspeed_parameters", "uniform": "deepspeed_uniform"}
"""--partition-method to its split's key in ppsim.plan.baselines."""
BATCH_FLAGS = (("train_batch_size", "global_batch_size", "--global-batch-size"),
               ("train_micro_batch_size_per_gpu", "micro_batch_size", "--micro-batch-size"),
               ("gradient_accumulation_steps", "microbatches", "--microbatches"))
"""Each batch key, the flag's dest that says the same number, and the flag."""
STATE = "deepspeed_state"
"""Where `apply` leaves what `finish` needs on the namespace (and that it ran)."""


def add_deepspeed_flags(p: argparse.ArgumentParser, partition: bool = True) -> None:
    """The DeepSpeed job's flags: its config file and its PipelineModule's arguments."""
    g = p.add_argument_group("DeepSpeed job (its ds_config.json and PipelineModule)")
    g.add_argument("--deepspeed-config", metavar="FILE", help="the job's DeepSpeed config "
                   "JSON: its batch, dtype, ZeRO stage and checkpointing, priced as "
                   "ppsim's flags (docs/model.md)")
    g.add_argument(INTERVAL_FLAG, dest="activation_checkpoint_interval", type=int,
                   metavar="N", help="PipelineModule's: 1 recomputes every layer, 0 none")
    if partition:
        g.add_argument("--partition-method", choices=tuple(PARTITION_KEYS),
                       help="simulate PipelineModule's split of this name (one stage a "
                       "rank; the spec list's entries: --deepspeed-specs)")


def _set(args: argparse.Namespace, dest: str, value: Any, key: str, flag: str) -> None:
    """args.dest = value, or refused where the command line says otherwise."""
    given = getattr(args, dest, None)
    if given is not None and given != value:
        raise UserError(key, f"gives {flag} {value}, the command line {flag} {given}",
                        "give it in one place")
    setattr(args, dest, value)


def _precision(args: argparse.Namespace, job: DeepSpeedJob) -> None:
    for dtype in ("bf16", "fp16"):
        if getattr(args, dtype, None) and job.dtype != dtype:
            raise UserError(f"{ROOT}.bf16", f"trains in {job.dtype}, the command line "
                            f"says --{dtype}", "give the dtype in one place")
    if job.dtype != "fp32":
        setattr(args, job.dtype, True)


def _state(args: argparse.Namespace, job: DeepSpeedJob) -> None:
    """The ZeRO stage and the gradients' dtype as Megatron's optimizer flags."""
    if job.zero_stage > 1:
        return  # refused by `finish`, which knows pp
    key = f"{ROOT}.zero_optimization.stage"
    grads = job.grad_accum_dtype
    if job.zero_stage == 1 and grads not in (None, job.dtype):
        raise UserError(f"{ROOT}.data_types.grad_accum_dtype", f"{grads}: ppsim prices "
                        f"ZeRO-1's gradients kept in the training dtype ({job.dtype})",
                        "drop it")
    bf16_optimizer = job.dtype == "bf16" and job.zero_stage == 0
    sharded = job.zero_stage == 1 or bf16_optimizer
    _set(args, "distributed_optimizer", sharded, key, "--use-distributed-optimizer")
    if job.dtype == "bf16":
        bf16_grads = grads == "bf16" if bf16_optimizer else True
        _set(args, "grad_reduce_in_bf16", bf16_grads, key, "--grad-reduce-in-bf16")
    elif grads not in (None, job.dtype) and not (job.dtype == "fp16" and grads == "fp16"):
        raise UserError(f"{ROOT}.data_types.grad_accum_dtype", f"{grads}: ppsim prices "
                        f"{job.dtype} training's gradients in {job.dtype}", "drop it")


def zero_of(dtype: str, distributed_optimizer: bool, grad_reduce_in_bf16: bool
            ) -> DeepSpeedJob | None:
    """The ZeRO stage (0 or 1, with data_types.grad_accum_dtype where it takes one) that
    `_state` translates to this optimizer, ZeRO-1 first; None where no stage does."""
    for stage, grads in ((1, None), (0, None), (0, "bf16")):
        job = DeepSpeedJob(dtype=dtype, zero_stage=stage, grad_accum_dtype=grads)
        flags = argparse.Namespace()
        try:
            _state(flags, job)
        except UserError:  # that gradient dtype under this training dtype
            continue
        if (flags.distributed_optimizer, getattr(flags, "grad_reduce_in_bf16", False)) == (
                distributed_optimizer, grad_reduce_in_bf16):
            return job
    return None


def _recompute(args: argparse.Namespace, job: DeepSpeedJob, read: bool = True) -> None:
    """PipelineModule's activation_checkpoint_interval (the flag's or the config's) as
    --recompute; `read`: a config was read, so with no interval and no Megatron
    recompute flag the job recomputes nothing, PipelineModule's default (interval 0)."""
    flag, key = getattr(args, "activation_checkpoint_interval", None), job.checkpoint_interval
    if flag is not None and key is not None and flag != key:
        raise UserError(INTERVAL_FLAG, f"{flag} disagrees with {ROOT}.pipeline."
                        f"activation_checkpoint_interval {key}", "give it in one place")
    interval = flag if flag is not None else key
    if interval is None and read and not any(
            getattr(args, dest, None) for dest in RECOMPUTE_DESTS):
        interval = 0  # PipelineModule's default: DeepSpeed recomputes nothing unasked
    if interval is None:
        return
    if interval not in RECOMPUTE_OF_INTERVAL:
        raise UserError(INTERVAL_FLAG if flag is not None else
                        f"{ROOT}.pipeline.activation_checkpoint_interval",
                        f"{interval}: ppsim prices interval 1 (every layer recomputed "
                        "alone, --recompute full) and 0 (none), not groups of layers",
                        "give 1 or 0")
    _set(args, "recompute", RECOMPUTE_OF_INTERVAL[interval],
         f"{INTERVAL_FLAG} {interval}", "--recompute")


def _batch(args: argparse.Namespace, job: DeepSpeedJob) -> BatchTriple | None:
    """The config's batch numbers, each filled by its flag where the config leaves it
    out; the flags are cleared so that `finish` checks the three by DeepSpeed's rule.
    None under the job search (--gpus), which takes the batch and the micro batch as
    its flags."""
    said = {}
    for key, dest, flag in BATCH_FLAGS:
        ours, theirs = getattr(job, _FIELD[key]), getattr(args, dest, None)
        if ours is not None and theirs is not None and ours != theirs:
            raise UserError(f"{ROOT}.{key}", f"{ours} disagrees with {flag} {theirs}",
                            "give it in one place")
        said[key] = ours if ours is not None else theirs
    triple = BatchTriple(said["train_batch_size"], said["train_micro_batch_size_per_gpu"],
                         said["gradient_accumulation_steps"])
    if getattr(args, "gpus", None) is not None:  # the job divides the batch itself
        if triple.grad_accum_steps is not None and getattr(args, "command", "") == "plan":
            _search_at_dp(args, triple)
            return None
        args.global_batch_size = triple.train_batch_size
        if triple.micro_batch is not None:
            args.micro_batch_size = triple.micro_batch
        if triple.grad_accum_steps is None:
            return None
        if triple.train_batch_size is None:  # DeepSpeed's rule at the shape's dp, in finish
            args.global_batch_size = None
        args.microbatches = None
        return triple
    if triple.micro_batch is not None and triple.micro_batch > 0:
        args.micro_batch_size = triple.micro_batch
    else:
        args.micro_batch_size = None
    args.global_batch_size = args.microbatches = None
    return triple


def _search_at_dp(args: argparse.Namespace, triple: BatchTriple) -> None:
    """The job search over a whole batch triple: the three fix the data-parallel size,
    train_batch_size / (micro x steps), which the search then holds (each shape's
    microbatches are the steps)."""
    train, micro, gas = triple.train_batch_size, triple.micro_batch, triple.grad_accum_steps
    if train is None or micro is None or gas is None:
        raise UserError(f"{ROOT}.gradient_accumulation_steps", "the job search gives each "
                        "shape train_batch_size / (micro batch x dp) steps",
                        "give train_batch_size and train_micro_batch_size_per_gpu beside "
                        "it (they fix dp), or drop it")
    steps = micro * gas
    dp = train // steps if steps > 0 else 0
    deepspeed_batch(triple, max(dp, 1))  # DeepSpeed's own words where the three disagree
    if args.dp is not None and args.dp != dp:
        raise UserError("--dp", f"{args.dp}, but train_batch_size {train} = "
                        f"{micro} x {gas} x dp {dp}", "give one of them")
    args.dp, args.global_batch_size, args.micro_batch_size = dp, train, micro


def _hold_engine(args: argparse.Namespace) -> None:
    """The job search keeps to what DeepSpeed's pipeline engine runs, whatever batch
    numbers the config gives: a shape it cannot run has no config to print."""
    if getattr(args, "gpus", None) is None or getattr(args, "command", "") != "plan":
        return
    for dest, value in ENGINE_SHAPE.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)


_FIELD = {"train_batch_size": "train_batch_size", "train_micro_batch_size_per_gpu":
          "micro_batch", "gradient_accumulation_steps": "grad_accum_steps"}


def apply(args: argparse.Namespace) -> None:
    """Translate --deepspeed-config and the PipelineModule flags into ppsim's flags on
    `args` (once: a command may call it before config_from_args does)."""
    if getattr(args, STATE, None) is not None:
        return
    path = getattr(args, "deepspeed_config", None)
    if path is None:
        if getattr(args, "activation_checkpoint_interval", None) is not None:
            _recompute(args, DeepSpeedJob(), read=False)
        setattr(args, STATE, False)
        return
    job = read_deepspeed_config(path)
    _precision(args, job)
    _state(args, job)
    _recompute(args, job)
    triple = _batch(args, job)
    _hold_engine(args)
    for key in job.noted:
        print(f"note: {key} taken, not priced (ppsim prices each collective by its "
              "traffic, not its buckets or overlap)", file=sys.stderr)
    setattr(args, STATE, (job, triple))


def finish(cfg: Config, args: argparse.Namespace) -> Config:
    """`cfg` with what needs the job's shape: the ZeRO stage under pp, fp32 training,
    the batch by DeepSpeed's rule at the job's dp, and DeepSpeed's split."""
    state = getattr(args, STATE, None)
    if not state:
        return _partitioned(cfg, args)
    job, triple = state
    arch = getattr(cfg.model, "arch", None)
    if arch is None:
        raise UserError(FLAG, "prices a transformer's batch and state", "give --preset "
                        "NAME or Megatron's model flags (--num-layers, --hidden-size, ...)")
    if job.zero_stage > 1:
        raise UserError(f"{ROOT}.zero_optimization.stage", "ZeRO-2 and ZeRO-3 are "
                        "incompatible with pipeline parallelism (DeepSpeed's words)"
                        if cfg.pipeline.pp > 1 else f"{job.zero_stage}: ppsim does not "
                        "price DeepSpeed's ZeRO-2 or ZeRO-3", "give stage 0 or 1; "
                        "--fsdp prices torchtitan's FSDP2 (ZeRO-3)")
    if arch.optimizer != "adam":
        raise UserError(f"{ROOT}.optimizer.type", f"Adam, but the model says "
                        f"{arch.optimizer}", "give the optimizer in one place")
    if job.dtype == "fp32" and arch.dtype != "fp32":
        cfg = with_overrides(cfg, model_table={**cfg.model.to_dict(), "dtype": "fp32"})
    if triple is not None:
        b = deepspeed_batch(triple, arch.dp)
        cfg = with_overrides(cfg, model={"micro_batch_size": b.micro_batch},
                             pipeline={"global_batch_size": b.train_batch_size,
                                       "microbatches": b.grad_accum_steps})
    return _partitioned(cfg, args)


def _partitioned(cfg: Config, args: argparse.Namespace) -> Config:
    """`cfg` with PipelineModule's split of --partition-method, if given."""
    method = getattr(args, "partition_method", None)
    if method is None:
        return cfg
    given = [k for k in SPLIT_KEYS if getattr(args, k, None) not in (None, False)]
    if given:
        raise UserError("--partition-method", f"and --{given[0].replace('_', '-')} both "
                        "give the split", "give one of them")
    validate.stages(cfg.pipeline)  # partitioned over pp stages: a config may hold any
    specs = parse_deepspeed_specs(getattr(args, "deepspeed_specs", "1,1"))
    key = PARTITION_KEYS[method]
    fw = next(s for s in deepspeed_splits(model_costs(cfg), cfg.pipeline.pp,
                                          cfg.pipeline.vpp, specs) if s.key == key)
    if fw.counts is None:
        raise UserError("--partition-method", f"{method}: {fw.note}",
                        "give vpp 1 and at least one spec entry a rank")
    return with_overrides(cfg, split={"split": list(fw.counts)})
