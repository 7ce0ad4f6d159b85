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


def add_config_flags(p: argparse.ArgumentParser, split_flags: bool = True) -> None:
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
    if split_flags:
        s = p.add_argument_group("split (one of)")
        s.add_argument("--split", metavar="N,N,...",
                       help="layers per virtual stage, or 'even' (Megatron's default)")
        s.add_argument("--layout", metavar="STR", help="Megatron pipeline layout string")
        s.add_argument("--first-stage-layers", type=int, metavar="N")
        s.add_argument("--last-stage-layers", type=int, metavar="N")
        s.add_argument("--account-for-embedding", action="store_true", default=None)
        s.add_argument("--account-for-loss", action="store_true", default=None)


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
    return with_overrides(cfg, preset=flag("preset"),
                          model={k: flag(k) for k in MODEL_KEYS},
                          pipeline={k: flag(k) for k in PIPELINE_KEYS}, split=split,
                          hardware=flag("hardware"), memory_bytes=memory,
                          costs_file=flag("costs"), devices=devices)


GPU_HARDWARE = "h100-80gb"
"""The hardware a GPU-class model preset is simulated on when no hardware is given."""
CPU_SIZED_PREFIX = "tiny-"
"""Model presets named so (tiny-gpt, tiny-llm) are sized for the embedded default's
CPU hardware; every other preset is a GPU-class model (billions of parameters)."""


def assume_hardware(args: argparse.Namespace, cfg: Config) -> tuple[Config, str]:
    """`--preset` names a GPU-class model and neither `--hardware` nor a config file
    chose the hardware: the embedded default's `cpu` preset would price it on a CPU
    (DeepSeek-V3 at 170,000 s an iteration), so GPU_HARDWARE is assumed. Returns the
    config and a one-line note saying so ('' when nothing was assumed)."""
    preset = getattr(args, "preset", None)
    if preset is None or preset.startswith(CPU_SIZED_PREFIX) or getattr(args, "config", None) \
            or getattr(args, "hardware", None) is not None or cfg.hardware.preset != "cpu":
        return cfg, ""
    memory = cfg.hardware.memory_bytes if getattr(args, "memory_gb", None) is not None \
        else None
    cfg = with_overrides(cfg, hardware=GPU_HARDWARE, memory_bytes=memory)
    return cfg, (f"assuming --hardware {GPU_HARDWARE}: --preset {preset} is a GPU-class "
                 "model and no --hardware was given (give one to choose another)")


def emit_json(obj: Any) -> None:
    """Strict JSON: a value that is not finite is written as null, never as NaN/Infinity."""
    sys.stdout.write(json.dumps(validate.finite_json(obj), indent=2, allow_nan=False) + "\n")
