"""The hardware a GPU-class model is priced on when nothing chose one.

The embedded default's `cpu` preset would price a GPU-class model on a CPU (DeepSeek-V3 at
170,000 s an iteration), and a config's missing [hardware] on a bare roofline (989
TFLOP/s at 50 %, every link free): both read as real figures. Where no flag and no
[hardware] preset chose the hardware, GPU_HARDWARE is assumed, and a note says so.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from ppsim.cli import megatron_model
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import Config, HardwareConfig

GPU_HARDWARE = "h100-80gb"
"""The hardware a GPU-class model preset is simulated on when no hardware is given."""
CPU_SIZED_PREFIX = "tiny-"
"""Model presets named so (tiny-gpt, tiny-llm) are sized for the embedded default's
CPU hardware; every other preset is a GPU-class model (billions of parameters)."""


def assume_hardware(args: argparse.Namespace, cfg: Config) -> tuple[Config, str]:
    """The config with GPU_HARDWARE where a GPU-class model (`--preset`, Megatron's flags,
    or a config's model preset) has no hardware chosen (no `--hardware`, and the config
    file has no [hardware] preset or fields but memory), and a one-line note ('' when
    nothing was assumed; a note alone where a config's [hardware] names no preset). A
    config's `tiny-` preset with no hardware chosen runs on `cpu`, as `--preset` runs it."""
    config = getattr(args, "config", None)
    if getattr(args, "hardware", None) is not None:
        return cfg, ""
    named = getattr(cfg.model, "preset", None) or ""
    if config and named.startswith(CPU_SIZED_PREFIX) and _bare(cfg.hardware):
        return _on(cfg, "cpu", args, config), ""  # as the embedded default runs it
    what = _gpu_class(args, cfg)
    if what is None:
        return cfg, ""
    if config and cfg.hardware.preset is None and not _bare(cfg.hardware):
        return cfg, (f"note: [hardware] in {config} names no preset: what it leaves out "
                     f"takes bare defaults (989 TFLOP/s at 50 %, links free); preset = "
                     f"\"{GPU_HARDWARE}\" there starts from a GPU")
    if (config and not _bare(cfg.hardware)) or (not config and cfg.hardware.preset != "cpu"):
        return cfg, ""
    cfg = _on(cfg, GPU_HARDWARE, args, config)
    chose = f"{config} chooses no hardware ([hardware] preset = NAME chooses one)" if config \
        else "no --hardware was given (give one to choose another)"
    return cfg, f"assuming --hardware {GPU_HARDWARE}: {what} and {chose}"


def _on(cfg: Config, preset: str, args: argparse.Namespace, config: str | None) -> Config:
    """`cfg` on the hardware preset, with the memory a flag or the config gave kept."""
    given = getattr(args, "memory_gb", None) is not None or \
        bool(config and cfg.hardware.memory_bytes != HardwareConfig().memory_bytes)
    return with_overrides(cfg, hardware=preset,
                          memory_bytes=cfg.hardware.memory_bytes if given else None)


def _gpu_class(args: argparse.Namespace, cfg: Config) -> str | None:
    """Why the model is GPU-class, or None where it is not (a tiny- preset, a uniform
    model, a transformer a config describes field by field)."""
    preset = getattr(args, "preset", None)
    if preset is not None:
        titan = getattr(args, "tt_config", None)  # its registry function chose the preset
        said = f"--torchtitan-config {titan}'s model" if titan else f"--preset {preset}"
        return None if preset.startswith(CPU_SIZED_PREFIX) else \
            f"{said} is a GPU-class model"
    if megatron_model.given(args) and not getattr(args, "config", None):
        return "Megatron's flags describe a GPU-class model"
    named = getattr(cfg.model, "preset", None)
    if getattr(args, "config", None) and named and not named.startswith(CPU_SIZED_PREFIX):
        return f"its model {named} is GPU-class"
    return None


def _bare(hw: HardwareConfig) -> bool:
    """No hardware chosen: every field the bare default's, memory aside."""
    return hw.preset is None and replace(hw, memory_bytes=HardwareConfig().memory_bytes) \
        == HardwareConfig()
