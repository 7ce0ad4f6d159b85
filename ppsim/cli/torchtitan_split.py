"""torchtitan's pipeline split as ppsim's: module_fqns_per_model_part read back to layers
per virtual stage, or the split torchtitan makes without it
(pipeline_parallel.py's _get_pipeline_metadata and _generate_llm_fqn_per_model_part,
ppsim.plan.baselines.torchtitan_counts): stages per rank from the schedule (one on
torch's single-stage GPipe and 1F1B, else two) or from
pipeline_parallel_layers_per_stage, the embedding and the head counted as
first/last_stage_less_layers layers."""

from __future__ import annotations

import argparse
import ast
import math

from ppsim.config.overrides import with_overrides
from ppsim.config.schema import Config
from ppsim.errors import UserError
from ppsim.pipeline.exports import TORCHTITAN_HEAD as HEAD
from ppsim.plan.baselines import torchtitan_counts

SINGLE_STAGE = ("gpipe", "1f1b")
"""ppsim's names of torch's PipelineScheduleSingle schedules (one stage per rank)."""
FQNS = "--parallelism.module_fqns_per_model_part"
PPSIM_SPLITS = ("split", "layout", "first_stage_layers", "last_stage_layers")


def fqn_counts(text: str) -> list[int]:
    """Decoder layers per part of a module_fqns_per_model_part (as ppsim prints it: a
    list of lists of names): the embedding first, the layers in order, norm and lm_head
    last; anything else is not a split ppsim prices."""
    fix = f"give e.g. [['tok_embeddings', 'layers.0'], ['layers.1', 'norm', '{HEAD}']]"
    try:
        parts = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise UserError(FQNS, "is not a list of lists of module names", fix) from None
    if not isinstance(parts, list) or not parts or not all(
            isinstance(p, list) and all(isinstance(n, str) for n in p) for p in parts):
        raise UserError(FQNS, "is not a list of lists of module names", fix)
    flat = [n for p in parts for n in p]
    layers = [n for n in flat if n.startswith("layers.")]
    expected = ["tok_embeddings", *(f"layers.{k}" for k in range(len(layers))), "norm", HEAD]
    if flat != expected or "tok_embeddings" not in parts[0] or parts[-1][-2:] != ["norm", HEAD]:
        raise UserError(FQNS, "ppsim prices the embedding on the first part, the layers in "
                        f"order, and norm and {HEAD} on the last", fix)
    return [sum(n.startswith("layers.") for n in p) for p in parts]


def pipeline_stages(args: argparse.Namespace) -> None:
    """The schedule (torchtitan's default 1F1B) and the chunks per rank, where they need
    no layer count: the parts listed, or the schedule's default."""
    if (args.pp or 1) <= 1:  # pp 1, or searched by `plan --gpus`
        return
    if args.schedule is None:
        args.schedule = "1f1b"
    vpp = None
    if args.tt_module_fqns_per_model_part is not None:
        args.tt_counts = fqn_counts(args.tt_module_fqns_per_model_part)
        parts = len(args.tt_counts)
        if parts % args.pp:
            raise UserError(FQNS, f"{parts} parts do not divide over "
                            f"pipeline_parallel_degree {args.pp}", "give a part count "
                            "that is a multiple of it")
        vpp = parts // args.pp
    elif args.tt_pipeline_parallel_layers_per_stage is None:
        vpp = 1 if args.schedule in SINGLE_STAGE else 2
    if vpp is not None:
        if args.vpp is not None and args.vpp != vpp:
            raise UserError("--vpp", f"{args.vpp} disagrees with torchtitan's {vpp} stages "
                            "per rank", "give one of them")
        args.vpp = vpp


def _stages(args: argparse.Namespace, layers: int) -> int:
    """Virtual stages from pipeline_parallel_layers_per_stage, checked as torchtitan
    checks them; else pp x vpp."""
    per = args.tt_pipeline_parallel_layers_per_stage
    if per is None:
        return args.pp * args.vpp
    name = "--parallelism.pipeline_parallel_layers_per_stage"
    if per < 1:
        raise UserError(name, f"must be at least 1, got {per}", "give N >= 1")
    stages = math.ceil((layers + _weight(args, "first") + _weight(args, "last")) / per)
    per_rank, rest = divmod(stages, args.pp)
    single = args.schedule in SINGLE_STAGE
    if rest or per_rank < 1 or (single and per_rank != 1) or (not single and per_rank < 2):
        raise UserError(name, f"gives {stages} stages over {args.pp} ranks, and the "
                        f"{'single' if single else 'multi'}-stage schedule takes "
                        f"{'1' if single else '2 or more'} a rank (torchtitan's check)",
                        "give another layer count")
    return stages


def _weight(args: argparse.Namespace, end: str) -> int:
    value = getattr(args, f"tt_pipeline_parallel_{end}_stage_less_layers")
    if value is not None and value < 0:
        raise UserError(f"--parallelism.pipeline_parallel_{end}_stage_less_layers",
                        f"must be at least 0, got {value}", "give N >= 0")
    return 1 if value is None else value


def with_torchtitan_split(cfg: Config, args: argparse.Namespace) -> Config:
    """`cfg` split as torchtitan splits it, for a torchtitan line with pp > 1 that gives
    no split in ppsim's or Megatron's words."""
    if not getattr(args, "torchtitan_line", False) or cfg.pipeline.pp <= 1 \
            or getattr(args, "pp", None) is None:  # the job search plans each shape's
        return cfg
    counts = getattr(args, "tt_counts", None)
    if any(getattr(args, k, None) is not None for k in PPSIM_SPLITS):
        if counts is not None:
            raise UserError(FQNS, "gives a split, and so does a split flag",
                            "give one of them")
        return cfg
    if getattr(cfg.model, "mtp_layers", 0):
        raise UserError("--parallelism.pipeline_parallel_degree", "torchtitan rejects MTP "
                        "under pipeline parallelism (deepseek_v3/mtp.py)",
                        "add --mtp-num-layers 0, or pipeline_parallel_degree 1")
    layers = cfg.num_layers
    if counts is None:
        stages = _stages(args, layers)
        made = torchtitan_counts(layers, stages, _weight(args, "first"), _weight(args, "last"))
        if isinstance(made, str):
            raise UserError("--parallelism.pipeline_parallel_degree", made,
                            "give fewer stages, or module_fqns_per_model_part")
        counts = list(made)
    elif sum(counts) != layers:
        raise UserError(FQNS, f"lists {sum(counts)} layers; the model has {layers}",
                        f"list layers.0 to layers.{layers - 1}")
    vpp = len(counts) // cfg.pipeline.pp
    return with_overrides(cfg, pipeline={"vpp": vpp}, split={"split": counts})
