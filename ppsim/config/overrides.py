"""The one way a loaded Config is changed: command-line flags, the TUI's edits,
`ppsim plan --search` variants and `ppsim run --versus` all call `with_overrides`,
so every front end keeps what it does not change ([placement], the cost file, the
rest of [model]) and is checked the way a loaded file is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ppsim.config.model import parse_model
from ppsim.config.schema import (
    SPLIT_KEYS,
    Config,
    PipelineConfig,
    check_config,
    hardware_choice,
)
from ppsim.config.state_rules import HOST_OPTIMIZER_KEYS
from ppsim.costs.state import OPTIMIZER_DTYPES
from ppsim.errors import UserError
from ppsim.job import shape as job_shape

MODEL_KEYS = ("num_layers", "recompute", "tp", "micro_batch_size", "hybrid_layer_pattern", "dp",
              "cp", "ep", "etp", "seq_length", "distributed_optimizer", "grad_reduce_in_bf16",
              "grads_in_fp32",
              "precision_aware_optimizer", "fsdp", "fsdp_reshard_after_forward",
              "fsdp_cpu_offload", "fsdp_framework", "dp_replicas", "bias_swiglu_fusion",
              "gradient_accumulation_fusion", "sequence_parallel",
              "cp_comm_type", "cp_a2a_size", "optimizer", "muon_ns_steps", "muon_tp_mode",
              "loss_chunks",
              *OPTIMIZER_DTYPES, *HOST_OPTIMIZER_KEYS)
"""[model] fields an override may set (the rest come from the file or the preset)."""
PIPELINE_KEYS = ("pp", "vpp", "microbatches", "schedule", "actions_csv",
                 "microbatch_group_size", "global_batch_size", "rank_order", "tp_comm_overlap",
                 "overlap_grad_reduce", "overlap_param_gather",
                 "overlap_param_gather_with_optimizer_step", "ddp_bucket_size",
                 "moe_shared_expert_overlap", "overlap_moe_expert_parallel_comm",
                 "moe_token_dispatcher_type", "delay_wgrad_compute",
                 "ddp_num_buckets", "moe_flex_dispatcher_num_sms")
"""[pipeline] fields an override may set besides the split."""


def with_split(pipe: PipelineConfig, **choice: Any) -> PipelineConfig:
    """`pipe` holding exactly this split choice (SPLIT_KEYS; None: not given): a split
    given replaces the whole of the old one, so a file's layout never mixes with a
    flag's counts. No choice at all: the default split."""
    unknown = sorted(set(choice) - set(SPLIT_KEYS))
    if unknown:
        raise ValueError(f"not split options: {unknown}; use {SPLIT_KEYS}")
    cleared = PipelineConfig()
    given = {k: v for k, v in choice.items() if v is not None}
    return replace(pipe, **{**{k: getattr(cleared, k) for k in SPLIT_KEYS}, **given})


def with_overrides(cfg: Config, *, preset: str | None = None,
                   model_table: dict[str, Any] | None = None,
                   model: dict[str, Any] | None = None,
                   pipeline: dict[str, Any] | None = None,
                   split: dict[str, Any] | None = None,
                   hardware: str | None = None, memory_bytes: float | None = None,
                   costs_file: str | None = None,
                   devices: list[int] | None = None,
                   memory: dict[str, Any] | None = None) -> Config:
    """`cfg` with the given changes (None: keep), checked as a loaded config is.

    preset replaces [model] by that preset, `model_table` by that table (read as a
    file's); `model` sets MODEL_KEYS on it; `pipeline`
    sets PIPELINE_KEYS; `split` (SPLIT_KEYS) replaces the split choice, {} meaning the
    default split; `hardware` replaces [hardware] by that preset (or that TOML file's
    table); `devices` sets [placement] devices; `memory` sets keys of the [memory]
    policy (creating it). Values given as None are not changes."""
    if preset and model_table:
        raise ValueError("give a preset or a model table, not both")
    changes = _given(model, MODEL_KEYS, "model")
    if model_table:  # checked whole: a flag's field may need another's (fp8_param_gather)
        m = parse_model({**model_table, **changes})
    else:
        m = parse_model({"preset": preset}) if preset else cfg.model
        if changes:
            m = m.with_fields(changes)  # parsed again: checked as a file's table is
    pipe_changes = _given(pipeline, PIPELINE_KEYS, "pipeline")
    pipe = replace(cfg.pipeline, **pipe_changes)
    if split is not None:
        pipe = with_split(pipe, **split)
    hw = hardware_choice(hardware) if hardware else replace(cfg.hardware)
    if memory_bytes is not None:
        hw.memory_bytes = memory_bytes
    place = replace(cfg.placement)
    if devices is not None:
        place.devices = list(devices)
    policy = cfg.memory if memory is None else {**(cfg.memory or {}), **memory}
    out = Config(model=m, pipeline=pipe, hardware=hw,
                 costs_file=costs_file or cfg.costs_file, placement=place, memory=policy)
    check_config(out)
    return job_shape.resolved(out, pipe_changes.get("microbatches"),
                              "global_batch_size" in pipe_changes)


def _given(values: dict[str, Any] | None, allowed: tuple[str, ...],
           section: str) -> dict[str, Any]:
    given = {k: v for k, v in (values or {}).items() if v is not None}
    for key in given:
        if key not in allowed:
            raise UserError(f"{section}.{key}", "cannot be overridden",
                            "override one of " + ", ".join(allowed))
    return given
