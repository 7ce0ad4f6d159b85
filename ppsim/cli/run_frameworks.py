"""torchtitan's fields and DeepSpeed's config on the commands that train for real
(`ppsim run`, and `ppsim demo`, which runs it): each is read as `simulate` reads it
(config_from_args) and runs where the executor runs what it says; what it does not run
is refused naming the field, before any process starts.

`ppsim run` has no job flags (its --dp counts the replicas it launches, its world is
pp x dp x tp x cp): a torchtitan size that needs the world (-1), HSDP's replicas and a
global batch have nothing to map onto there, and DeepSpeed's batch rule holds at the
run's --dp."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ppsim.cli import deepspeed_job
from ppsim.cli.deepspeed_batch import deepspeed_batch
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import Config
from ppsim.errors import UserError

SHARD = "--parallelism.data_parallel_shard_degree"


def prepare_run(args: argparse.Namespace) -> None:
    """Before config_from_args on `ppsim run`'s flags: refuse the torchtitan fields it
    cannot take, and settle DeepSpeed's batch at the replicas --dp launches."""
    if hasattr(args, "gpus"):
        return  # a command with the job flags maps them all
    if getattr(args, "torchtitan_line", False) and not getattr(args, "torchtitan_read", False):
        _titan_on_run(args)
    if getattr(args, "deepspeed_config", None) is not None and args.dp is not None:
        _deepspeed_batch_at(args, args.dp)


def whole_loss(cfg: Any) -> Any:
    """The config a run trains: a config-registry function's chunked loss (its
    ChunkedLossWrapper) runs whole in the executor, so the run's trace prices it whole."""
    chunks = getattr(getattr(cfg.model, "arch", None), "loss_chunks", 0)
    if not chunks:
        return cfg
    print(f"note: ChunkedLossWrapper's {chunks} loss chunks taken, not run (the executor "
          "computes the loss whole)", file=sys.stderr)
    return with_overrides(cfg, model={"loss_chunks": 0})


def _titan_on_run(args: argparse.Namespace) -> None:
    shard = args.tt_data_parallel_shard_degree
    if shard == -1 or (shard is None and args.tt_config is not None):
        said = f"{args.tt_config}'s data_parallel_shard_degree is -1" if shard is None \
            else "-1"
        raise UserError(SHARD, f"{said}: it takes the ranks left over, and ppsim run "
                        "launches the ranks its flags give (pp x dp x tp x cp)",
                        f"give {SHARD} N, the replicas ppsim run launches")
    if (args.tt_data_parallel_replicate_degree or 1) > 1:
        raise UserError("--parallelism.data_parallel_replicate_degree", "the executor's "
                        "FSDP shards over the whole data-parallel group (no HSDP)",
                        "drop it, or give 1; simulate and plan price HSDP")
    if args.tt_num_tokens_per_train_step not in (None, -1):
        raise UserError("--training.num_tokens_per_train_step", "ppsim run runs one "
                        "accumulation step an iteration (it takes no global batch)",
                        "drop it; parallelism.num_pp_microbatches gives the microbatches")
    args.global_batch_size = None  # read by torchtitan's batch rule; run takes none


def _deepspeed_batch_at(args: argparse.Namespace, dp: int) -> None:
    """DeepSpeed's batch triple solved at `dp` replicas, as the run's --micro-batch-size
    and --microbatches (config_from_args would solve it at the model's dp)."""
    deepspeed_job.apply(args)
    job, triple = getattr(args, deepspeed_job.STATE)
    if triple is None:
        return
    b = deepspeed_batch(triple, dp)
    args.micro_batch_size, args.microbatches = b.micro_batch, b.grad_accum_steps
    setattr(args, deepspeed_job.STATE, (job, None))  # solved: finish keeps it


def check_runs(args: argparse.Namespace, cfg: Config) -> None:
    """What a torchtitan line asks that the executor does not run (after
    config_from_args): FSDP2 without pipeline parallelism. (DeepSpeed's ZeRO-2 and -3
    are refused by every command.)"""
    if getattr(args, "torchtitan_line", False) and cfg.pipeline.pp == 1:
        raise UserError("--parallelism.pipeline_parallel_degree", "1: a torchtitan line "
                        "shards with FSDP2, and the executor runs FSDP with pipeline "
                        "parallelism only", "give 2 or more to run it; simulate and plan "
                        "price FSDP at pp 1")
