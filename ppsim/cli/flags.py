"""The flags every command shares: the config, its overrides and the split; JSON out."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from ppsim import fileio
from ppsim.cli import (
    deepspeed_job,
    job_flags,
    megatron_flags,
    megatron_model,
    megatron_run,
    torchtitan_flags,
)
from ppsim.cli.flag_values import nonempty
from ppsim.cli.job_flags import JOB_MODEL_KEYS, add_job_flags, megatron_fsdp_state
from ppsim.cli.memory_flags import add_memory_policy_flags, memory_flags
from ppsim.config import files, validate
from ppsim.config.model import parse_model
from ppsim.config.overrides import MODEL_KEYS, PIPELINE_KEYS, with_overrides
from ppsim.config.schema import SPLIT_KEYS, Config, PipelineConfig, load_config
from ppsim.errors import UserError
from ppsim.job import shape as job_shape
from ppsim.pipeline.layout import is_layout
from ppsim.schedules.generators import (
    SCHEDULES,
    chunks_for_schedule,
    schedule_for_vpp,
    schedule_name,
)

MEGATRON_MODEL_KEYS = ("cp_comm_type", "cp_a2a_size", "optimizer", "muon_ns_steps",
                       "muon_tp_mode")
"""Overridable [model] fields a Megatron model flag sets (megatron_model.model_table reads
them as Megatron writes them)."""
RESHAPING = {"pp": "--pp", "vpp": "--vpp", "num_layers": "--num-layers", "preset": "--preset",
             "hybrid_layer_pattern": "--hybrid-layer-pattern",
             "layers_per_virtual_stage": "--num-layers-per-virtual-pipeline-stage"}
"""Flags that change how many layers or stages there are (a saved split no longer fits)."""


def _ints(text: str, flag: str) -> list[int] | str:
    if text.strip() == "even":
        return "even"
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UserError(flag, f"{text!r} is not a comma-separated list of integers",
                        "write e.g. 6,2" + (", or give a layout string with --layout"
                                            if is_layout(text) else "")) from None


class _MegatronTensorSize(argparse.Action):
    """Megatron's --tensor-model-parallel-size: the line is Megatron's, read as Megatron
    reads it (no sequence parallelism unless it says --sequence-parallel)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.megatron_tp = True


def add_config_flags(p: argparse.ArgumentParser, split_flags: bool = True,
                     job_flags: bool = True) -> None:
    g = p.add_argument_group("config (flags override the file)")
    g.add_argument("--config", metavar="FILE", help="TOML config; default: embedded preset")
    g.add_argument("--preset", metavar="NAME", type=nonempty("a model preset's name"),
                   help="model preset (replaces [model])")
    g.add_argument("--hardware", metavar="NAME", type=nonempty("a hardware preset's name"),
                   help="hardware preset, or a TOML file's [hardware] table (ppsim "
                   "calibrate --log writes one)")
    _add_pipeline_flags(g)
    add_memory_policy_flags(g)
    g.add_argument("--tp", dest="tp", type=int, metavar="N", help="tensor-parallel size")
    g.add_argument("--tensor-model-parallel-size", dest="tp", type=int, metavar="N",
                   action=_MegatronTensorSize, help="Megatron's name: without "
                   "--sequence-parallel, none (Megatron's default)")
    g.add_argument("--sequence-parallel", dest="sequence_parallel", action="store_true",
                   default=None, help="split the activations between the tensor-parallel "
                   "blocks by tokens (ppsim's default; Megatron's flag)")
    g.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false",
                   help="every tensor rank holds those activations whole; all-reduces")
    g.add_argument("--no-bias-swiglu-fusion", dest="bias_swiglu_fusion", action="store_false",
                   default=None, help="Megatron's eager SwiGLU: its SiLU output kept too")
    g.add_argument("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion",
                   action="store_false", default=None, help="Megatron's unfused weight "
                   "gradients: written, then added into the main grads")
    g.add_argument("--memory-gb", type=float, metavar="GB", help="memory limit per rank")
    g.add_argument("--costs", metavar="FILE", type=nonempty("a cost file's path"),
                   help="measured cost file (ppsim profile)")
    g.add_argument("--actions-csv", metavar="FILE", type=nonempty("a CSV file's path"),
                   help="run this per-rank order instead of --schedule's (a "
                   "torch.distributed.pipelining schedule CSV)")
    g.add_argument("--devices", metavar="D,D,...",
                   help="device of each rank, e.g. 0,0 for two ranks sharing one device")
    megatron_model.add_model_flags(p)
    if job_flags:
        add_job_flags(p)
    if split_flags:
        add_split_flags(p)
    # Every command that reads the overrides reads torchtitan's and DeepSpeed's too
    # (config_from_args applies them); PipelineModule's split goes with --split.
    torchtitan_flags.add_torchtitan_flags(p)
    deepspeed_job.add_deepspeed_flags(p, partition=split_flags)


def _add_pipeline_flags(g: Any) -> None:
    """The stack's layers and the pipeline: its ranks, chunks, microbatches and order."""
    g.add_argument("--num-layers", type=int, metavar="N",
                   help="decoder layers (over a preset or config too)")
    g.add_argument("--hybrid-layer-pattern", "--hybrid-override-pattern",
                   dest="hybrid_layer_pattern", metavar="STR",
                   type=nonempty("the stack's layer symbols"), help="Megatron's hybrid stack, "
                   "one symbol a layer: M Mamba-2, G GatedDeltaNet, * attention, D DSA, + MLA, "
                   "- MLP, E MoE; | stage boundaries, / MTP depths")
    g.add_argument("--mtp-num-layers", type=int, metavar="N", help="MTP depths, over a "
                   "preset or config too (0: none); a hybrid layer pattern keeps its own, "
                   "as Megatron does")
    g.add_argument("--pp", "--pipeline-model-parallel-size", dest="pp", type=int, metavar="N",
                   help="pipeline ranks")
    g.add_argument("--vpp", "--virtual-pipeline-model-parallel-size",
                   "--num-virtual-stages-per-pipeline-rank", dest="vpp", type=int,
                   metavar="N", help="chunks (virtual stages) per rank")
    g.add_argument("--num-layers-per-virtual-pipeline-stage", dest="layers_per_virtual_stage",
                   type=int, metavar="N", help="Megatron's other way to give vpp: the "
                   "layers of one chunk")
    g.add_argument("--microbatches", type=int, metavar="N", help="microbatches per "
                   "iteration (alone: replaces the config's global batch)")
    g.add_argument("--schedule", metavar="NAME", type=schedule_name,
                   help=f"pipeline schedule: {', '.join(SCHEDULES)} (or torch's name, "
                   "e.g. Interleaved1F1B)")
    g.add_argument("--microbatch-group-size",
                   "--microbatch-group-size-per-virtual-pipeline-stage",
                   dest="microbatch_group_size", type=int, metavar="N",
                   help="microbatches per group of the interleaved order")


def add_split_flags(p: argparse.ArgumentParser, counts: bool = True) -> None:
    """The split, in each of the ways Megatron, torchtitan and ppsim give one (`counts`:
    with ppsim's --split; `plan` takes Megatron's ways alone, its launch line's split)."""
    s = p.add_argument_group("split (one of)")
    if counts:
        s.add_argument("--split", metavar="N,N,...",
                       help="layers per virtual stage, or 'even' (Megatron's default)")
    s.add_argument("--layout", "--pipeline-model-parallel-layout", dest="layout",
                   metavar="STR", help="Megatron pipeline layout string")
    s.add_argument("--first-stage-layers", "--decoder-first-pipeline-num-layers",
                   dest="first_stage_layers", type=int, metavar="N",
                   help="layers of the first stage, the rest spread evenly")
    s.add_argument("--last-stage-layers", "--decoder-last-pipeline-num-layers",
                   dest="last_stage_layers", type=int, metavar="N",
                   help="layers of the last stage, the rest spread evenly")
    s.add_argument("--account-for-embedding", "--account-for-embedding-in-pipeline-split",
                   dest="account_for_embedding", action="store_true", default=None,
                   help="count the embedding as a layer in the even split")
    s.add_argument("--account-for-loss", "--account-for-loss-in-pipeline-split",
                   dest="account_for_loss", action="store_true", default=None,
                   help="count the head and loss as a layer in the even split")


def _layers_per_virtual_stage(cfg: Config, flag: Any) -> Config:
    """`cfg` with the vpp Megatron derives from --num-layers-per-virtual-pipeline-stage."""
    per_chunk = flag("layers_per_virtual_stage")
    if per_chunk is None:
        return cfg
    if getattr(getattr(cfg.model, "arch", None), "hybrid_layer_pattern", ""):
        raise UserError("--num-layers-per-virtual-pipeline-stage", "should not be used with "
                        "--hybrid-layer-pattern. To specify virtual pipelining, describe a "
                        "number of pipeline segments in --hybrid-layer-pattern that is a "
                        "multiple of --pipeline-model-parallel-size greater than 1 "
                        "(Megatron's words)", "drop it, and give the segments with | in the "
                        "pattern (or ppsim's --vpp)")
    others = (("vpp", "--vpp (--num-virtual-stages-per-pipeline-rank)"),
              ("layout", "--pipeline-model-parallel-layout"),
              ("first_stage_layers", "--decoder-first-pipeline-num-layers"),
              ("last_stage_layers", "--decoder-last-pipeline-num-layers"))
    pipe = cfg.pipeline
    vpp = megatron_flags.vpp_for_layers_per_stage(
        per_chunk, cfg.model.num_layers, pipe.pp, embedding=bool(pipe.account_for_embedding),
        loss=bool(pipe.account_for_loss),
        other=next((name for key, name in others if flag(key) is not None), None))
    schedule = flag("schedule") or schedule_for_vpp(pipe.schedule, vpp)
    return with_overrides(cfg, pipeline={"vpp": vpp, "schedule": schedule})


def _gpus_dp(cfg: Config, gpus: int | None) -> int | None:
    """The dp --gpus gives for the configured tp, cp and pp."""
    if gpus is None:
        return None
    a = job_shape.arch_of(cfg.model)
    if a is None:
        raise UserError("--gpus", "needs a transformer model (a preset)",
                        "give --preset NAME, or --pp for a uniform model")
    validate.stages(cfg.pipeline)  # the world divides by pp: a config may hold any
    return job_shape.dp_for_gpus(gpus, a.tp, a.cp, cfg.pipeline.pp)


def _split_choice(args: argparse.Namespace, flag: Any) -> dict[str, Any] | None:
    """The split the flags choose: a given one replaces the file's; {} (the default split)
    where the embedded default's own no longer fits; None: keep the file's."""
    chosen = {k: flag(k) for k in SPLIT_KEYS}
    if any(v is not None for v in chosen.values()):
        if chosen["split"] is not None:
            chosen["split"] = _ints(chosen["split"], "--split")
        return chosen
    if args.config is None and (any(flag(k) is not None for k in RESHAPING)
                                or _schedule_chunks(flag)):
        return {}
    return None


def _schedule_chunks(flag: Any) -> int | None:
    """The vpp a --schedule sets where neither --vpp nor a layout gives one (V: 2)."""
    if flag("schedule") is None or flag("vpp") is not None or flag("layout") is not None:
        return None
    return chunks_for_schedule(flag("schedule"))


def _hardware_flags(args: argparse.Namespace, flag: Any
                    ) -> tuple[float | None, list[int] | None]:
    """--memory-gb in bytes and --devices as a list (None: not given)."""
    limit = flag("memory_gb")
    if limit is not None:
        limit = validate.number(
            "--memory-gb (hardware.memory_bytes)", limit, lo=0.0, lo_open=True,
            hi=validate.MAX_BYTES / 1e9, fix="give the memory one rank may use, e.g. 80") * 1e9
    devices = None
    if flag("devices") is not None:
        devices = _ints(args.devices, "--devices")
        if isinstance(devices, str):
            raise UserError("--devices", "needs one device index per rank", "e.g. 0,0")
    return limit, devices


def config_from_args(args: argparse.Namespace) -> Config:
    """Load --config (or the default) and apply the flags on top (ppsim.config.overrides)."""
    flag = lambda key: getattr(args, key, None)  # noqa: E731 - a command may lack a flag
    torchtitan_flags.apply_torchtitan(args)  # torchtitan's fields as ppsim's flags
    deepspeed_job.apply(args)  # a DeepSpeed job's config, as the flags below
    cfg = load_config(args.config, {"preset": flag("preset")} if flag("preset") else None)
    limit, devices = _hardware_flags(args, flag)
    said = memory_flags(flag, cfg.memory)
    pipeline = _pipeline_flags(cfg, flag)
    # A command without the job flags (ppsim run has a --dp of its own) sets only those
    # of them it has.
    keys = MODEL_KEYS if hasattr(args, "gpus") else tuple(
        k for k in MODEL_KEYS if k not in JOB_MODEL_KEYS or (k != "dp" and hasattr(args, k)))
    keys = tuple(k for k in keys if k not in MEGATRON_MODEL_KEYS)
    model = {k: flag(k) for k in keys}
    if flag("fsdp_framework") == "megatron" and "ep" in model and model["ep"] is None:
        model["ep"] = 1  # as pp: Megatron's default, the only one --use-torch-fsdp2 takes
    if flag("gpus") is not None and flag("dp") is None:
        model["dp"] = 1  # not the preset's: --gpus sets it once tp, cp, pp are (_with_world)
    # Megatron's model flags change a preset or a config's model; else they build one.
    base = parse_model({"preset": flag("preset")}) if flag("preset") else \
        cfg.model if args.config else None
    table = megatron_model.model_table(args, base)
    if table is not None and base is None:
        # A job described by Megatron's flags alone has Megatron's pipeline defaults (no
        # --pipeline-model-parallel-size: one stage; no global batch: one microbatch),
        # not the embedded default's two CPU ranks.
        cfg = replace(cfg, pipeline=PipelineConfig(pp=1, microbatches=1))
    # A Megatron line (its tensor size's name, or a model built from its flags) has
    # Megatron's default: no sequence parallelism unless it says --sequence-parallel.
    megatron_line = flag("megatron_tp") or (table is not None and base is None)
    if megatron_line and (flag("tp") or 1) > 1 and flag("sequence_parallel") is None:
        model["sequence_parallel"] = False
    order = megatron_run.check_run_flags(args)
    if order is not None:
        pipeline["rank_order"] = order
    cfg = with_overrides(cfg, preset=None if table else flag("preset"), model_table=table,
                         memory=said.memory or None,
                         model=megatron_fsdp_state(model)
                         | ({"recompute": said.mode} if said.mode else {}),
                         pipeline=pipeline, split=_split_choice(args, flag),
                         hardware=flag("hardware"), memory_bytes=limit,
                         costs_file=flag("costs"), devices=devices)
    cfg = _layers_per_virtual_stage(cfg, flag)
    cfg = torchtitan_flags.with_torchtitan_split(cfg, args)
    _check_megatrons_rules(cfg, args, flag)
    if flag("dp") is None:  # a torchtitan line's shard -1: dp is the world's
        torchtitan_flags.check_one_step(args, _gpus_dp(cfg, flag("gpus")))
    return deepspeed_job.finish(_with_world(cfg, flag), args)


def _pipeline_flags(cfg: Config, flag: Any) -> dict[str, Any]:
    """The [pipeline] keys the flags set, Megatron's defaults and older names read."""
    pipeline = {k: flag(k) for k in PIPELINE_KEYS if k != "global_batch_size"}
    if pipeline.get("moe_token_dispatcher_type") == "allgather":
        pipeline["moe_token_dispatcher_type"] = None  # check_experts_parallel says why
    if pipeline.get("moe_flex_dispatcher_num_sms") is None:
        pipeline["moe_flex_dispatcher_num_sms"] = flag("moe_deepep_num_sms") or flag(
            "moe_hybridep_num_sms")  # the older, per-backend names
    if flag("fsdp_framework") == "megatron" and pipeline.get("pp") is None:
        pipeline["pp"] = 1  # Megatron's default, and the only one --use-torch-fsdp2 takes
    if pipeline.get("vpp") is not None and pipeline.get("schedule") is None:
        # As Megatron, --vpp alone picks the 1F1B variant (an explicit --schedule is kept).
        pipeline["schedule"] = schedule_for_vpp(cfg.pipeline.schedule, pipeline["vpp"])
    elif chunks := _schedule_chunks(flag):
        pipeline["vpp"] = chunks  # a V schedule's two
    return pipeline


def _check_megatrons_rules(cfg: Config, args: argparse.Namespace, flag: Any) -> None:
    """What Megatron refuses of the configuration the flags made, and the notes on the
    launch-line flags ppsim takes and does not price."""
    megatron_flags.check_flex_backend(flag("moe_flex_dispatcher_backend"),
                                      cfg.pipeline.moe_token_dispatcher_type,
                                      bool(flag("moe_enable_deepep")))
    megatron_flags.check_experts_parallel(getattr(cfg.model, "arch", None),
                                          flag("moe_token_dispatcher_type"),
                                          bool(cfg.pipeline.moe_shared_expert_overlap))
    _check_layer_counts(cfg, flag)
    megatron_run.check_repeated_mtp(args, getattr(cfg.model, "mtp_layers", 0))
    megatron_flags.check_positions(getattr(getattr(cfg.model, "arch", None), "seq_length", None),
                                   flag("max_position_embeddings"))
    for note in megatron_run.unpriced_notes(args):
        print(note, file=sys.stderr)


def _check_layer_counts(cfg: Config, flag: Any) -> None:
    """--mtp-num-layers and --num-layers where the model kept its own counts: only a hybrid
    pattern does (it names its layers and MTP depths), and Megatron warns and goes on."""
    model_mtp = getattr(cfg.model, "mtp_layers", 0)
    for name, wanted, has, what in (("--mtp-num-layers", flag("mtp_num_layers"), model_mtp,
                                     "MTP depths"),
                                    ("--num-layers", flag("num_layers"), cfg.num_layers,
                                     "layers")):
        if wanted is not None and wanted != has:
            print(f"warning: {name} {wanted} ignored: the hybrid layer pattern has {has} "
                  f"{what}", file=sys.stderr)


def _with_world(cfg: Config, flag: Any) -> Config:
    """The world gives dp once tp, cp and pp are known; then the global batch divides
    by it."""
    dp = _gpus_dp(cfg, flag("gpus"))
    if dp is not None and flag("dp") is not None and flag("dp") != dp:
        shard = flag("tt_data_parallel_shard_degree")
        if shard not in (None, -1):  # a torchtitan line's dp: its shard (x replicate) degree
            raise UserError("--parallelism.data_parallel_shard_degree", f"{shard} gives dp "
                            f"{flag('dp')}, and --gpus {flag('gpus')} gives dp = {dp} at "
                            "this tp, cp and pp", "give -1 (the ranks left over), or drop "
                            "--gpus")
        raise UserError("--dp", f"{flag('dp')} disagrees with --gpus {flag('gpus')}, which "
                        f"gives dp = {dp} at this tp, cp and pp", "give --gpus or --dp")
    if flag("global_batch_size") is not None:
        job_flags.check_global_batch(flag("global_batch_size"))
    elif dp is None:
        return cfg
    return with_overrides(cfg, model={"dp": dp},
                          pipeline={"global_batch_size": flag("global_batch_size"),
                                    "microbatches": flag("microbatches")})


def emit_json(obj: Any) -> None:
    """Strict JSON: a value that is not finite is written as null, never as NaN/Infinity."""
    sys.stdout.write(json.dumps(files.finite_json(obj), indent=2, allow_nan=False) + "\n")


def outputs_apart(args: argparse.Namespace, outputs: dict[str, str | None],
                  inputs: dict[str, str | None] | None = None, cfg: Config | None = None
                  ) -> None:
    """Refuse an output path that is an input (the config flags', `inputs`, and the files
    `cfg` names) or another output; ppsim.fileio.refuse_overlap names both."""
    fileio.refuse_overlap({**input_paths(args, cfg), **(inputs or {})}, outputs)


def input_paths(args: argparse.Namespace, cfg: Config | None = None) -> dict[str, str | None]:
    """The files the config flags read (and those `cfg` names), by the flag or key that
    gave each: no output may replace one."""
    given = {f: getattr(args, k, None) for f, k in (("--config", "config"), ("--costs", "costs"),
                                                   ("--actions-csv", "actions_csv"),
                                                   ("--deepspeed-config", "deepspeed_config"),
                                                   ("--hardware", "hardware"))}
    if cfg is not None:
        given["costs_file"] = cfg.costs_file
        given["pipeline.actions_csv"] = getattr(cfg.pipeline, "actions_csv", None)
    return given
