"""The flags every command shares: the config, its overrides and the split; JSON out."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ppsim.config import validate
from ppsim.config.overrides import MODEL_KEYS, PIPELINE_KEYS, with_overrides
from ppsim.config.schema import SPLIT_KEYS, Config, load_config
from ppsim.errors import UserError
from ppsim.job import shape as job_shape

JOB_MODEL_KEYS = ("dp", "cp", "ep", "seq_length")
"""[model] fields only the job flags set."""
RESHAPING = ("pp", "vpp", "num_layers", "preset")
"""Flags that change how many layers or stages there are (a saved split no longer fits)."""


def _ints(text: str, flag: str) -> list[int] | str:
    if text.strip() == "even":
        return "even"
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UserError(flag, f"{text!r} is not a comma-separated list of integers",
                        "write e.g. 6,2") from None


def add_config_flags(p: argparse.ArgumentParser, split_flags: bool = True,
                     job_flags: bool = True) -> None:
    g = p.add_argument_group("config (flags override the file)")
    g.add_argument("--config", metavar="FILE", help="TOML config; default: embedded preset")
    g.add_argument("--preset", metavar="NAME", help="model preset (replaces [model])")
    g.add_argument("--hardware", metavar="NAME", help="hardware preset")
    g.add_argument("--num-layers", type=int, metavar="N")
    g.add_argument("--pp", type=int, metavar="N", help="pipeline ranks")
    g.add_argument("--vpp", type=int, metavar="N", help="chunks (virtual stages) per rank")
    g.add_argument("--microbatches", type=int, metavar="N")
    g.add_argument("--schedule", metavar="NAME")
    g.add_argument("--recompute", metavar="MODE", help="none | selective | full")
    g.add_argument("--tp", type=int, metavar="N", help="tensor-parallel size")
    g.add_argument("--memory-gb", type=float, metavar="GB", help="memory limit per rank")
    g.add_argument("--costs", metavar="FILE", help="measured cost file (ppsim profile)")
    g.add_argument("--actions-csv", metavar="FILE", help="run this per-rank order instead of "
                   "--schedule's (a torch.distributed.pipelining schedule CSV)")
    g.add_argument("--devices", metavar="D,D,...",
                   help="device of each rank, e.g. 0,0 for two ranks sharing one device")
    if job_flags:
        add_job_flags(p)
    if split_flags:
        s = p.add_argument_group("split (one of)")
        s.add_argument("--split", metavar="N,N,...",
                       help="layers per virtual stage, or 'even' (Megatron's default)")
        s.add_argument("--layout", metavar="STR", help="Megatron pipeline layout string")
        s.add_argument("--first-stage-layers", type=int, metavar="N")
        s.add_argument("--last-stage-layers", type=int, metavar="N")
        s.add_argument("--account-for-embedding", action="store_true", default=None)
        s.add_argument("--account-for-loss", action="store_true", default=None)


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """The whole job's shape and its overlaps, named as Megatron names them."""
    j = p.add_argument_group("job (Megatron's names; ppsim.job)")
    j.add_argument("--dp", type=int, metavar="N", help="data-parallel size")
    j.add_argument("--gpus", type=int, metavar="N", help="world size: dp = N / (tp x pp x cp)")
    j.add_argument("--cp", "--context-parallel-size", dest="cp", type=int, metavar="N",
                   help="context-parallel size")
    j.add_argument("--ep", type=int, metavar="N", help="expert-parallel size")
    j.add_argument("--seq-length", type=int, metavar="N", help="tokens per sequence")
    j.add_argument("--micro-batch-size", type=int, metavar="N", help="sequences per microbatch")
    j.add_argument("--global-batch-size", type=int, metavar="N",
                   help="sequences per iteration: microbatches = N / (micro batch x dp)")
    j.add_argument("--rank-order", metavar="ORDER", help="Megatron rank order, innermost "
                   "first (default tp-cp-ep-dp-pp)")
    for name in ("tp-comm-overlap", "overlap-grad-reduce", "overlap-param-gather"):
        j.add_argument(f"--{name}", action="store_true", default=None)


def _gpus_dp(cfg: Config, gpus: int | None) -> int | None:
    """The dp --gpus gives for the configured tp, cp and pp."""
    if gpus is None:
        return None
    a = job_shape.arch_of(cfg.model)
    if a is None:
        raise UserError("--gpus", "needs a transformer model (a preset)",
                        "give --preset NAME, or --pp for a uniform model")
    return job_shape.dp_for_gpus(gpus, a.tp, a.cp, cfg.pipeline.pp)


def config_from_args(args: argparse.Namespace) -> Config:
    """Load --config (or the default) and apply the flags on top (ppsim.config.overrides)."""
    cfg = load_config(args.config)
    flag = lambda key: getattr(args, key, None)  # noqa: E731 - a command may lack a flag
    chosen = {k: flag(k) for k in SPLIT_KEYS}
    split: dict[str, Any] | None = None
    if any(v is not None for v in chosen.values()):
        # A split given on the command line replaces whatever the file chose.
        if chosen["split"] is not None:
            chosen["split"] = _ints(chosen["split"], "--split")
        split = chosen
    elif args.config is None and any(flag(k) is not None for k in RESHAPING):
        split = {}  # the embedded default's split fits only the embedded default
    memory = flag("memory_gb")
    if memory is not None:
        memory = validate.number(
            "--memory-gb (hardware.memory_bytes)", memory, lo=0.0, lo_open=True,
            hi=validate.MAX_BYTES / 1e9, fix="give the memory one rank may use, e.g. 80") * 1e9
    devices = None
    if flag("devices") is not None:
        devices = _ints(args.devices, "--devices")
        if isinstance(devices, str):
            raise UserError("--devices", "needs one device index per rank", "e.g. 0,0")
    pipeline = {k: flag(k) for k in PIPELINE_KEYS if k != "global_batch_size"}
    # A command without the job flags (ppsim run has a --dp of its own) sets none of them.
    keys = MODEL_KEYS if hasattr(args, "gpus") else tuple(k for k in MODEL_KEYS
                                                          if k not in JOB_MODEL_KEYS)
    cfg = with_overrides(cfg, preset=flag("preset"), model={k: flag(k) for k in keys},
                         pipeline=pipeline, split=split, hardware=flag("hardware"),
                         memory_bytes=memory, costs_file=flag("costs"), devices=devices)
    # The world gives dp once tp, cp and pp are known; then the global batch divides by it.
    dp = _gpus_dp(cfg, flag("gpus"))
    if dp is None and flag("global_batch_size") is None:
        return cfg
    return with_overrides(cfg, model={"dp": dp},
                          pipeline={"global_batch_size": flag("global_batch_size")})


def emit_json(obj: Any) -> None:
    """Strict JSON: a value that is not finite is written as null, never as NaN/Infinity."""
    sys.stdout.write(json.dumps(validate.finite_json(obj), indent=2, allow_nan=False) + "\n")
