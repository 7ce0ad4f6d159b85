"""A DeepSpeed config JSON (ds_config.json) read for what ppsim prices: the batch triple,
the training dtype, the ZeRO stage, how gradients accumulate, the pipeline's activation
checkpoint interval. Keys are named as DeepSpeed's config-json documentation names them.

Three kinds of key, by what they do to one steady iteration:
- TAKEN: nothing ppsim prices (logging, the learning rate, clipping). Taken, silent.
- NOTED: a bucket size or an overlap, a little of the gradient reduction's time ppsim
  does not model. Taken, named on stderr.
- everything else that changes time or memory (offload, ZeRO-2/3 with a pipeline,
  activation partitioning, compression, ...): refused in one line naming the key.
A key ppsim does not know is refused too: it may change either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ppsim.config import files, limits, validate
from ppsim.errors import UserError

FLAG = "--deepspeed-config"
ROOT = "deepspeed_config"
MAX_BYTES = 1 << 20
"""A DeepSpeed config is a few kilobytes."""
TAKEN = ("steps_per_print", "wall_clock_breakdown", "dump_state", "gradient_clipping",
         "prescale_gradients", "gradient_predivide_factor", "scheduler", "tensorboard",
         "wandb", "csv_monitor", "comet", "comms_logger", "flops_profiler",
         "memory_breakdown", "checkpoint", "zero_allow_untested_optimizer",
         "zero_force_ds_cpu_optimizer", "aio")
"""Top-level keys that change neither an iteration's time nor its memory (logging,
monitors, checkpoint I/O, the learning rate's schedule, gradient clipping's norm)."""
ZERO_TAKEN = ("stage", "ignore_unused_parameters", "load_from_fp32_weights",
              "elastic_checkpoint")
ZERO_NOTED = ("allgather_partitions", "allgather_bucket_size", "overlap_comm",
              "reduce_scatter", "reduce_bucket_size", "contiguous_gradients",
              "round_robin_gradients")
"""ZeRO's bucket and overlap tunings: ppsim prices each collective by its traffic."""
ZERO3_ONLY = ("stage3_max_live_parameters", "stage3_max_reuse_distance",
              "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
              "stage3_model_persistence_threshold", "stage3_gather_16bit_weights_on_model_save",
              "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold",
              "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
              "stage3_partition_stream_chunk_size", "sub_group_size", "memory_efficient_linear",
              "override_module_apply", "mics_shard_size", "mics_hierarchical_params_gather")
"""Keys DeepSpeed reads at stage 3 alone (deepspeed/runtime/zero/config.py): taken below
it, as a config written for either stage holds them."""
FP16_TAKEN = ("enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
              "hysteresis", "consecutive_hysteresis", "min_loss_scale")
"""fp16's dynamic loss scaling: a scalar per step, nothing ppsim prices."""
PIPELINE_TAKEN = ("stages", "partition", "seed_layers", "pipe_partitioned",
                  "grad_partitioned", "use_reentrant", "activation_checkpoint_interval")
CHECKPOINTING_TAKEN = ("number_checkpoints", "profile")
CHECKPOINTING_OFF = ("partition_activations", "cpu_checkpointing",
                     "contiguous_memory_optimization", "synchronize_checkpoint_boundary")
"""deepspeed.checkpointing's switches that move or reshape the saved activations (or
synchronize at each checkpoint): taken off, refused on."""
DTYPES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "fp16": "fp16",
          "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
"""DeepSpeed's DtypeEnum spellings, each to ppsim's dtype name."""
ADAM = ("adam", "adamw")
"""DeepSpeed's optimizer types ppsim prices (it lowercases the name)."""
DROP = "drop it to price the job without it"


@dataclass(frozen=True)
class DeepSpeedJob:
    """What a DeepSpeed config says of the iteration ppsim prices (None: not said)."""

    train_batch_size: int | None = None
    micro_batch: int | None = None
    """train_micro_batch_size_per_gpu."""
    grad_accum_steps: int | None = None
    """gradient_accumulation_steps: the microbatches under pipeline parallelism."""
    dtype: str = "fp32"
    zero_stage: int = 0
    grad_accum_dtype: str | None = None
    """data_types.grad_accum_dtype as ppsim names the dtype."""
    checkpoint_interval: int | None = None
    """pipeline.activation_checkpoint_interval."""
    noted: list[str] = field(default_factory=list)
    """Keys taken but not priced, by their full names."""


def _key(*path: str) -> str:
    return ".".join((ROOT, *path))


def _table(value: Any, *path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(_key(*path), f"must be a JSON object, got {type(value).__name__}",
                        'write e.g. {"enabled": true}')
    return value


def _switch(value: Any, *path: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(_key(*path), f"must be true or false, got {value!r}",
                        "write true or false")
    return value


MOST = {"train_batch_size": limits.MAX_GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": validate.ARCH_MAX,
        "gradient_accumulation_steps": limits.MAX_MICROBATCHES}
"""Each batch key's largest number: ppsim's limits on the global batch, the micro batch
and the microbatches."""


def within_limit(key: str, value: int, where: str = "") -> None:
    """A batch key's number, given or derived (`where`: at which dp), refused by the key
    above ppsim's limit on what it becomes."""
    if value > MOST[key]:
        raise UserError(_key(key), f"{value:,} is above ppsim's limit of {MOST[key]:,}{where}",
                        f"give at most {MOST[key]:,}")


def _count(value: Any, key: str) -> int | None:
    """A batch size (None: null); "auto" is Hugging Face's, filled in by its Trainer."""
    if value is None:
        return None
    if value == "auto":
        raise UserError(_key(key), "is \"auto\", which Hugging Face's Trainer fills in "
                        "from its own arguments", "write the number the job runs with")
    n = validate.count(_key(key), value, lo=-limits.MAX_GLOBAL_BATCH,
                       hi=limits.MAX_GLOBAL_BATCH, fix="write a whole number")
    within_limit(key, n)
    return n


def _refuse_unknown(table: dict[str, Any], known: tuple[str, ...], *path: str) -> None:
    for key in table:
        if key not in known:
            raise UserError(_key(*path, key), "ppsim does not know it, and it may change "
                            "an iteration's time or memory", DROP)


def _refuse_on(table: dict[str, Any], keys: tuple[str, ...], why: str, *path: str) -> None:
    for key in keys:
        if key in table and _switch(table[key], *path, key):
            raise UserError(_key(*path, key), why, "set it to false, or " + DROP)


def _dtype(cfg: dict[str, Any]) -> str:
    """bf16 (or its older name bfloat16), fp16, or fp32 when neither is enabled."""
    on = []
    for name in ("bf16", "bfloat16", "fp16"):
        if name not in cfg:
            continue
        table = _table(cfg[name], name)
        _refuse_unknown(table, FP16_TAKEN if name == "fp16" else ("enabled",), name)
        if _switch(table.get("enabled", False), name, "enabled"):
            on.append(name)
    if "amp" in cfg and _switch(_table(cfg["amp"], "amp").get("enabled", False), "amp",
                                "enabled"):
        raise UserError(_key("amp", "enabled"), "NVIDIA Apex's AMP is not priced by ppsim",
                        "train with bf16 or fp16 enabled instead")
    if "bf16" in on and "fp16" in on or "bfloat16" in on and "fp16" in on:
        raise UserError(_key("bf16", "enabled"), "bf16 and fp16 modes cannot be "
                        "simultaneously enabled (DeepSpeed's words)", "enable one of them")
    return "fp16" if "fp16" in on else "bf16" if on else "fp32"


def _zero(cfg: dict[str, Any], noted: list[str]) -> int:
    """The ZeRO stage; offloading refused (ppsim's host optimizer is Megatron's). At
    stages 2 and 3 the stage alone is refused (deepspeed_job.finish): the table's other
    keys are moot, so a real ZeRO-3 config is refused by its stage, not by its tunings."""
    table = _table(cfg.get("zero_optimization", {}), "zero_optimization")
    stage = table.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise UserError(_key("zero_optimization", "stage"), f"must be 0, 1, 2 or 3, got "
                        f"{stage!r}", "write e.g. 1")
    if stage > 1:
        return int(stage)
    for part in ("offload_optimizer", "offload_param"):
        if part in table and table[part] is not None:
            device = _table(table[part], "zero_optimization", part).get("device", "none")
            if device != "none":
                raise UserError(_key("zero_optimization", part), f"device {device!r}: "
                                "ZeRO-Offload is not priced by ppsim (its host optimizer, "
                                "--optimizer-cpu-offload, is Megatron's, which steps a "
                                "precision-aware optimizer's shard on the host)",
                                "set its device to \"none\", or " + DROP)
    _refuse_on(table, ("cpu_offload",), "ZeRO-Offload is not priced by ppsim",
               "zero_optimization")
    _refuse_unknown(table, (*ZERO_TAKEN, *ZERO_NOTED, *ZERO3_ONLY, "offload_optimizer",
                            "offload_param", "cpu_offload"), "zero_optimization")
    noted += [_key("zero_optimization", k) for k in ZERO_NOTED if k in table]
    return int(stage)


def _optimizer(cfg: dict[str, Any]) -> None:
    table = _table(cfg.get("optimizer", {}), "optimizer")
    _refuse_unknown(table, ("type", "params"), "optimizer")
    kind = table.get("type", "Adam")
    if not isinstance(kind, str) or kind.lower() not in ADAM:
        raise UserError(_key("optimizer", "type"), f"{kind!r}: ppsim prices Adam's state "
                        "and step", "give Adam or AdamW, or " + DROP)
    if "params" in table:
        _table(table["params"], "optimizer", "params")  # lr, betas, ...: taken


def _grad_accum_dtype(cfg: dict[str, Any]) -> str | None:
    table = _table(cfg.get("data_types", {}), "data_types")
    _refuse_unknown(table, ("grad_accum_dtype",), "data_types")
    given = table.get("grad_accum_dtype")
    if given is None:
        return None
    if not isinstance(given, str) or given not in DTYPES:  # a list or a table: unhashable
        raise UserError(_key("data_types", "grad_accum_dtype"), f"{given!r} is not a dtype",
                        "write fp32, bf16 or fp16")
    return DTYPES[given]


def _checkpointing(cfg: dict[str, Any]) -> int | None:
    """The pipeline's activation checkpoint interval, if the config gives one."""
    table = _table(cfg.get("activation_checkpointing", {}), "activation_checkpointing")
    _refuse_unknown(table, (*CHECKPOINTING_TAKEN, *CHECKPOINTING_OFF),
                    "activation_checkpointing")
    _refuse_on(table, CHECKPOINTING_OFF, "moves, partitions or synchronizes the saved "
               "activations, which ppsim does not price", "activation_checkpointing")
    pipe = _table(cfg.get("pipeline", {}), "pipeline")
    _refuse_unknown(pipe, PIPELINE_TAKEN, "pipeline")
    interval = pipe.get("activation_checkpoint_interval")
    if interval is None:
        return None
    return validate.count(_key("pipeline", "activation_checkpoint_interval"), interval, lo=0,
                          hi=limits.MAX_MICROBATCHES, fix="write 0 (none) or 1 (every layer)")


def _communication(cfg: dict[str, Any]) -> None:
    for key in ("communication_data_type", "seq_parallel_communication_data_type"):
        if cfg.get(key) is not None:
            raise UserError(_key(key), f"{cfg[key]!r}: ppsim prices the gradients reduced "
                            "in the dtype they are kept in", "set it to null, or " + DROP)


HANDLED = ("train_batch_size", "train_micro_batch_size_per_gpu",
           "gradient_accumulation_steps", "bf16", "bfloat16", "fp16", "amp",
           "zero_optimization", "optimizer", "data_types", "activation_checkpointing",
           "pipeline", "communication_data_type", "seq_parallel_communication_data_type")
"""Top-level keys read above."""


def read_deepspeed_config(path: str) -> DeepSpeedJob:
    """The DeepSpeed config at `path`, read (never written) and checked key by key."""
    cfg = files.read_json(FLAG, path, MAX_BYTES, "DeepSpeed config",
                          "give the ds_config.json the job is launched with",
                          max_containers=10_000)
    if not isinstance(cfg, dict):
        raise UserError(FLAG, f"{path} holds a JSON {type(cfg).__name__}, not an object",
                        "give the ds_config.json the job is launched with")
    _refuse_unknown(cfg, (*TAKEN, *HANDLED))
    noted: list[str] = []
    dtype = _dtype(cfg)
    stage = _zero(cfg, noted)
    _optimizer(cfg)
    _communication(cfg)
    return DeepSpeedJob(
        train_batch_size=_count(cfg.get("train_batch_size"), "train_batch_size"),
        micro_batch=_count(cfg.get("train_micro_batch_size_per_gpu"),
                           "train_micro_batch_size_per_gpu"),
        grad_accum_steps=_count(cfg.get("gradient_accumulation_steps"),
                                "gradient_accumulation_steps"),
        dtype=dtype, zero_stage=stage, grad_accum_dtype=_grad_accum_dtype(cfg),
        checkpoint_interval=_checkpointing(cfg), noted=noted)
