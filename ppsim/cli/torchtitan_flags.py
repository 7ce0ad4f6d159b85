"""torchtitan's command-line overrides (`--parallelism.tensor_parallel_degree 8`, its
`activation-checkpoint:full` subcommand) and a config-registry function
(`--torchtitan-config llama3_70b`, ppsim.cli.torchtitan_registry) as ppsim's own job
flags: each is translated onto the flag that says the same (torchtitan/config/configs.py
names the fields), and ppsim's path from there prices it. A torchtitan line shards as
torchtitan does (--fsdp); what ppsim does not price is refused naming the field."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ppsim.cli.torchtitan_registry import REGISTRY, RegistryJob, registry_job
from ppsim.cli.torchtitan_split import pipeline_stages, with_torchtitan_split
from ppsim.config import limits
from ppsim.config.validate import ARCH_MAX
from ppsim.costs.choices import FSDP_RESHARD
from ppsim.costs.op_sac import OP_SAC
from ppsim.errors import UserError
from ppsim.schedules.generators import TORCH_NAMES, schedule_name

__all__ = ["add_torchtitan_flags", "apply_torchtitan", "subcommand_words",
           "with_torchtitan_split"]

AC_SUBCOMMAND = "--activation-checkpoint"
"""The option torchtitan's `activation-checkpoint:MODE` subcommand is read as."""
RECOMPUTE_OF_AC = {"none": "none", "full": "full", "selective": OP_SAC}
"""torchtitan's policies ppsim prices, as its recompute modes: those the export writes
back (AC_OF_MODE; not MemoryBudgetAC, whose saves the compiler's partitioner picks)."""
TORCHTITAN_AC = ("full", "selective", "none", "memory-budget")
"""torchtitan's activation-checkpoint subcommands (distributed/activation_checkpoint.py)."""
DEFAULT_AC = "selective"
"""Trainer.Config's activation_checkpoint where nothing sets it: SelectiveAC.Config
(torchtitan/trainer.py)."""


class _Field(argparse.Action):
    """A torchtitan field: stored where ppsim's flag stores it, the line marked
    torchtitan's (it shards as torchtitan does)."""

    def __init__(self, *args: Any, const: Any = None, **kwargs: Any) -> None:
        if const is not None:
            kwargs["nargs"] = 0
        super().__init__(*args, const=const, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const if self.const is not None else values)
        namespace.torchtitan_line = True


def _torch_schedule(text: str) -> str:
    """A schedule torchtitan names (torch's class name), as ppsim's name; one ppsim does
    not price is refused under the field's own name."""
    name = schedule_name(text)
    if name not in TORCH_NAMES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a schedule ppsim prices (give one of "
            f"{', '.join(TORCH_NAMES.values())})")
    return name


def _degree(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def add_torchtitan_flags(p: argparse.ArgumentParser) -> None:
    """torchtitan's dotted fields that ppsim prices, and its config-registry function."""
    t = p.add_argument_group(
        "torchtitan's fields (its config's names; FSDP as it shards)",
        "its launch line's fields: --parallelism.tensor_parallel_degree N, "
        "--parallelism.data_parallel_shard_degree N, --training.max_context_length N, "
        "activation-checkpoint:selective, ... (the list: docs/model.md)")
    t.add_argument("--torchtitan-config", dest="tt_config", action=_Field, metavar="NAME",
                   help="a config-registry function's model, parallelism and training "
                   f"({', '.join(REGISTRY)})")
    same = (("parallelism.tensor_parallel_degree", "tp", _degree),
            ("parallelism.context_parallel_degree", "cp", _degree),
            ("parallelism.expert_parallel_degree", "ep", _degree),
            ("parallelism.pipeline_parallel_degree", "pp", _degree),
            ("parallelism.pipeline_parallel_schedule", "schedule", _torch_schedule),
            ("training.max_context_length", "seq_length", _degree))
    for name, dest, kind in same:
        t.add_argument(f"--{name}", dest=dest, type=kind, action=_Field, metavar="V",
                       help=argparse.SUPPRESS)
    t.add_argument("--parallelism.fsdp_reshard_after_forward", action=_Field,
                   dest="fsdp_reshard_after_forward", choices=FSDP_RESHARD,
                   help=argparse.SUPPRESS)
    t.add_argument("--compile.enable_async_tensor_parallel", dest="tp_comm_overlap",
                   action=_Field, const=True, help=argparse.SUPPRESS)
    for name in ("parallelism.data_parallel_shard_degree",
                 "parallelism.data_parallel_replicate_degree", "parallelism.num_pp_microbatches",
                 "parallelism.pipeline_parallel_layers_per_stage",
                 "parallelism.pipeline_parallel_first_stage_less_layers",
                 "parallelism.pipeline_parallel_last_stage_less_layers",
                 "training.num_tokens_per_microbatch_per_dp_rank",
                 "training.num_tokens_per_train_step"):
        t.add_argument(f"--{name}", dest=_dest(name), type=_degree, action=_Field,
                       metavar="N", help=argparse.SUPPRESS)
    for name in ("parallelism.module_fqns_per_model_part", "training.mixed_precision_param",
                 "training.mixed_precision_reduce", "training.dtype"):
        t.add_argument(f"--{name}", dest=_dest(name), action=_Field, metavar="V",
                       help=argparse.SUPPRESS)
    t.add_argument("--compile.enable", dest="tt_compile", action=_Field, const=True,
                   help=argparse.SUPPRESS)
    t.add_argument("--loss.num_chunks", dest="loss_chunks", type=_degree, action=_Field,
                   metavar="N", help=argparse.SUPPRESS)
    t.add_argument(AC_SUBCOMMAND, dest="tt_ac", action=_Field, help=argparse.SUPPRESS)


DEGREES = (("parallelism.tensor_parallel_degree", "tp"),
           ("parallelism.context_parallel_degree", "cp"),
           ("parallelism.expert_parallel_degree", "ep"),
           ("parallelism.pipeline_parallel_degree", "pp"),
           ("training.max_context_length", "seq_length"))
"""torchtitan's sizes that take no value below 1 (its data-parallel shard takes -1)."""


def _dest(name: str) -> str:
    return "tt_" + name.split(".", 1)[1]


def subcommand_words(words: list[str]) -> list[str]:
    """torchtitan's `activation-checkpoint:MODE` (tyro's subcommand, either spelling) as
    the option argparse reads."""
    out = []
    for word in words:
        head, colon, mode = word.partition(":")
        if colon and head in ("activation-checkpoint", "activation_checkpoint"):
            out.append(f"{AC_SUBCOMMAND}={mode}")
        else:
            out.append(word)
    return out


def apply_torchtitan(args: argparse.Namespace, job_search: bool = False) -> None:
    """Set ppsim's job flags from the torchtitan fields given, over the registry
    function's (its fields given on the line win, as torchtitan's CLI over its config).
    `job_search` (`plan --gpus`): the sizes not given are searched, not torchtitan's
    defaults, and each shape's microbatches are its global batch's."""
    if not getattr(args, "torchtitan_line", False) or getattr(args, "torchtitan_read", False):
        return
    args.torchtitan_read = True
    for name, dest in DEGREES:
        _positive(name, getattr(args, dest, None), "give N >= 1")
    reg = registry_job(args.tt_config) if args.tt_config is not None else None
    if reg is not None:
        _registry_defaults(args, reg, job_search)
    if getattr(args, "fsdp_framework", None) is not None or args.distributed_optimizer:
        raise UserError("--use-distributed-optimizer" if args.distributed_optimizer else
                        "--use-torch-fsdp2 (--use-megatron-fsdp)", "is Megatron's; a "
                        "torchtitan line shards with FSDP2 as torchtitan applies it",
                        "drop it")
    args.fsdp = True
    if args.sequence_parallel is None:  # enable_sequence_parallel: on, Megatron's name or not
        args.sequence_parallel = True
    if args.pp is None and not job_search:
        args.pp = 1  # torchtitan's default (ppsim's embedded config runs two CPU ranks)
    _data_parallel(args, -1 if reg is not None else None)
    _recompute(args)
    _precision(args)
    if args.tt_compile or (reg is not None and reg.compile):
        print("note: compile.enable taken, not priced (ppsim prices the eager kernels)",
              file=sys.stderr)
    _batch(args, job_search)
    pipeline_stages(args)


SEARCHED = ("tp", "cp", "ep", "pp", "tt_num_tokens_per_microbatch_per_dp_rank")
"""The function's sizes `plan --gpus` searches rather than holds (the micro batch is
its tokens a microbatch)."""


def _registry_defaults(args: argparse.Namespace, reg: RegistryJob, job_search: bool) -> None:
    """The function's model and fields, where the line does not give them; under the job
    search (`job_search`) its parallel sizes and micro batch are searched, as the ones a
    line leaves out are."""
    if args.preset is not None and args.preset != reg.preset:
        raise UserError("--preset", f"{args.preset} is not {args.tt_config}'s model "
                        f"({reg.preset})", "drop --preset, or --torchtitan-config")
    args.preset = reg.preset
    for dest, value in (("mtp_num_layers", reg.mtp_layers), ("tp", reg.tensor_parallel_degree),
                        ("cp", reg.context_parallel_degree),
                        ("ep", reg.expert_parallel_degree),
                        ("pp", reg.pipeline_parallel_degree),
                        ("schedule", schedule_name(reg.pipeline_parallel_schedule)),
                        ("seq_length", reg.max_context_length),
                        ("tt_num_tokens_per_microbatch_per_dp_rank",
                         reg.num_tokens_per_microbatch_per_dp_rank),
                        ("tp_comm_overlap", reg.async_tp or None),
                        ("loss_chunks", reg.loss_chunks)):
        if getattr(args, dest, None) is None and value is not None and not (
                job_search and dest in SEARCHED):
            setattr(args, dest, value)
    if reg.float8 and args.fp8_format is None:  # torchao's rowwise Float8Linear
        args.fp8_format, args.fp8_recipe = "hybrid", args.fp8_recipe or "rowwise"


def _positive(name: str, value: int | None, fix: str) -> None:
    if value is not None and value < 1:
        raise UserError(f"--{name}", f"must be at least 1, got {value}", fix)


def _data_parallel(args: argparse.Namespace, registry_shard: int | None) -> None:
    """dp = data_parallel_shard_degree x data_parallel_replicate_degree (HSDP's copies:
    --dp-replicas); shard -1 takes the ranks left over (--gpus)."""
    shard = args.tt_data_parallel_shard_degree
    shard = registry_shard if shard is None else shard
    replicate = args.tt_data_parallel_replicate_degree
    _positive("parallelism.data_parallel_replicate_degree", replicate, "give N >= 1")
    if replicate is not None:
        args.dp_replicas = replicate
    if shard is None:
        return
    if shard == -1:
        if args.gpus is None and args.dp is None:
            raise UserError("--parallelism.data_parallel_shard_degree", "-1 takes the ranks "
                            "left over, which needs the world size", "give --gpus N, or "
                            "the shard degree")
        return
    _positive("parallelism.data_parallel_shard_degree", shard, "give N >= 1, or -1")
    dp = shard * (replicate or 1)
    if args.dp is not None and args.dp != dp:
        raise UserError("--parallelism.data_parallel_shard_degree", f"gives dp {dp}, and "
                        f"--dp says {args.dp}", "give one of them")
    args.dp = dp


def torchtitan_ac(args: argparse.Namespace) -> str | None:
    """The activation-checkpoint subcommand a torchtitan line runs: the one given, else
    the registry function's, else torchtitan's default; None where ppsim's --recompute
    alone says the policy."""
    if args.tt_ac is not None:
        return args.tt_ac
    if args.tt_config is not None:
        return registry_job(args.tt_config).activation_checkpoint
    return DEFAULT_AC if args.recompute is None else None


def _recompute(args: argparse.Namespace) -> None:
    """activation-checkpoint:full, :selective or :none as ppsim's recompute mode."""
    ac = torchtitan_ac(args)
    if ac is None:
        return
    if ac not in TORCHTITAN_AC:
        raise UserError("activation_checkpoint", f"{ac!r} is none of torchtitan's modes "
                        f"({', '.join(TORCHTITAN_AC)})", "give activation-checkpoint:full "
                        "or activation-checkpoint:none")
    if ac not in RECOMPUTE_OF_AC:
        said = f"{args.tt_config}'s " if args.tt_ac is None else ""
        raise UserError("activation_checkpoint", f"{said}{ac} is not priced (MemoryBudgetAC "
                        "saves what the compiler's partitioner picks)",
                        "give activation-checkpoint:full, :selective or :none")
    mode = RECOMPUTE_OF_AC[ac]
    if args.recompute is not None and args.recompute != mode:
        raise UserError("--recompute", f"{args.recompute} disagrees with "
                        f"activation-checkpoint:{ac}", "give one of them")
    args.recompute = mode


def _precision(args: argparse.Namespace) -> None:
    """The dtypes ppsim prices: bf16 compute over fp32 shards, fp32 gradient reduction."""
    for name, priced in (("mixed_precision_param", "bfloat16"),
                         ("mixed_precision_reduce", "float32"), ("dtype", "float32")):
        value = getattr(args, f"tt_{name}")
        if value is not None and value != priced:
            raise UserError(f"--training.{name}", f"{value} is not priced (ppsim prices "
                            "FSDP2's bf16 compute over fp32 shards, gradients reduced in "
                            f"fp32)", f"give {priced}, or drop it")


def _batch(args: argparse.Namespace, job_search: bool) -> None:
    """Tokens as sequences: the microbatch is num_tokens_per_microbatch_per_dp_rank over
    the sequence, the global batch num_tokens_per_train_step over it (-1: one
    accumulation step); with pp, num_pp_microbatches is one accumulation step's."""
    seq = args.seq_length
    mb_tokens = args.tt_num_tokens_per_microbatch_per_dp_rank
    step_tokens = args.tt_num_tokens_per_train_step
    for name, tokens in (("num_tokens_per_microbatch_per_dp_rank", mb_tokens),
                         ("num_tokens_per_train_step", step_tokens)):
        if tokens is None or (tokens == -1 and name.endswith("train_step")):
            continue
        _positive(f"training.{name}", tokens, "give a positive token count")
        if seq is None:
            raise UserError(f"--training.{name}", "counts tokens, and the sequence length "
                            "is not given", "add --training.max_context_length N")
        if tokens % seq:
            raise UserError(f"--training.{name}", f"{tokens} tokens are not whole sequences "
                            f"of {seq}", f"give a multiple of {seq}")
        # The limits of the micro batch and the global batch, said in tokens.
        most = ARCH_MAX if name.endswith("dp_rank") else limits.MAX_GLOBAL_BATCH
        if tokens // seq > most:
            raise UserError(f"--training.{name}", f"{tokens:,} tokens are {tokens // seq:,} "
                            f"sequences of {seq}, above the limit of {most:,}",
                            f"give at most {most * seq:,} tokens")
    if mb_tokens is not None:
        args.micro_batch_size = mb_tokens // seq
    if step_tokens is not None and step_tokens != -1:
        args.global_batch_size = step_tokens // seq
    pp_mbs = args.tt_num_pp_microbatches
    _positive("parallelism.num_pp_microbatches", pp_mbs, "give N >= 1")
    if args.microbatches is not None or job_search:
        return
    if args.pp > 1:  # one accumulation step's
        args.microbatches = pp_mbs or 1
        check_one_step(args, args.dp)  # else at the world's dp (ppsim.cli.flags)
    elif args.global_batch_size is None:
        args.microbatches = 1  # one accumulation step (num_pp_microbatches is ignored)


def check_one_step(args: argparse.Namespace, dp: int | None) -> None:
    """A torchtitan line with pp whose step is more than one accumulation step (its
    num_pp_microbatches x micro batch x `dp` sequences) is refused naming the field that
    gives the step: torchtitan runs a pipeline schedule an accumulation step, ppsim
    prices one a step."""
    if (not getattr(args, "torchtitan_read", False) or dp is None or (args.pp or 1) < 2
            or args.microbatches is None):
        return
    one_step = args.microbatches * (args.micro_batch_size or 1) * dp
    if args.global_batch_size in (None, one_step):
        return
    in_tokens = args.tt_num_tokens_per_train_step not in (None, -1)
    raise UserError("--training.num_tokens_per_train_step" if in_tokens else
                    "--global-batch-size", "gives more than one gradient-accumulation "
                    "step, and ppsim prices one pipeline schedule a step (torchtitan runs "
                    "one an accumulation step)",
                    (f"give {one_step * args.seq_length} tokens" if in_tokens else
                     f"give {one_step}") + ", or more num_pp_microbatches")
