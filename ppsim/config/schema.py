"""The TOML config: [model], [pipeline], [hardware], [placement]; loading (saving as
TOML: ppsim.config.to_toml).

Every user mistake becomes a `UserError` naming the field and the fix. Flags and
other edits are applied by ppsim.config.overrides; the CLI's flags are in ppsim.cli.flags.
"""

from __future__ import annotations

import functools
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ppsim.config import files, sections, validate, validate_hardware
from ppsim.config.model import ARCH_FIELDS, Model, UniformModel, parse_model
from ppsim.config.presets import HARDWARE_PRESETS
from ppsim.costs.model import LAYER_FIELDS
from ppsim.errors import UserError, one_of
from ppsim.job import combined
from ppsim.job import shape as job_shape
from ppsim.pipeline.placement import PlacementConfig
from ppsim.policy.model import POLICY_KEYS, memory_policy, op_sac_memory_refusal
from ppsim.schedules.generators import chunks_for_schedule, schedule_for_vpp, schedule_name

SPLIT_KEYS = ("split", "layout", "first_stage_layers", "last_stage_layers",
              "account_for_embedding", "account_for_loss")
"""The [pipeline] options that choose a split: at most one way is used at a time."""

DEFAULT_TOML = """\
# ppsim's embedded default: a tiny LLM on 2 CPU ranks, 1F1B, uneven split.
# Its vocabulary (8192) dwarfs its width (64), as an LLM's does, so on a CPU
# the LM head and loss weigh ~4 of its layers on the last rank.
[model]
preset = "tiny-llm"

[pipeline]
pp = 2
vpp = 1
microbatches = 8
schedule = "1f1b"
# What `ppsim demo` plans from this CPU's measured costs: 2 layers join the head.
split = [6, 2]

[hardware]
preset = "cpu"
"""


@dataclass(kw_only=True)
class PipelineConfig:
    pp: int = 2
    """Pipeline ranks."""
    vpp: int = 1
    """Model chunks (virtual stages) per rank."""
    microbatches: int = 8
    """Microbatches per iteration (gradient accumulation steps)."""
    schedule: str = "1f1b"
    """gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv, dualpipev."""
    split: list[int] | str | None = None
    """Layers per virtual stage, Megatron order (MTP layers count too); or "even":
    Megatron's default split, refused when the layers do not divide."""
    layout: str | None = None
    """Megatron --pipeline-model-parallel-layout."""
    first_stage_layers: int | None = None
    """Megatron --decoder-first-pipeline-num-layers."""
    last_stage_layers: int | None = None
    """Megatron --decoder-last-pipeline-num-layers."""
    account_for_embedding: bool = False
    account_for_loss: bool = False
    actions_csv: str | None = None
    """A torch.distributed.pipelining schedule CSV whose order replaces `schedule`'s."""
    microbatch_group_size: int | None = None
    """Microbatches per group of the interleaved table, Megatron's
    --microbatch-group-size-per-virtual-pipeline-stage; none: the smallest group that
    runs (ppsim.schedules.generators.interleaved_group)."""
    global_batch_size: int = 0
    """Sequences per iteration over all replicas (Megatron --global-batch-size); set, it
    gives microbatches = global_batch_size / (micro_batch_size x dp); 0: `microbatches`."""
    rank_order: str = "tp-cp-ep-dp-pp"
    """Megatron's rank order, innermost first: which groups share a node."""
    tp_comm_overlap: bool = False
    """Hide tensor-parallel collectives behind the layer's compute (--tp-comm-overlap)."""
    overlap_grad_reduce: bool = False
    """Reduce gradients in buckets during the last backward (--overlap-grad-reduce)."""
    moe_shared_expert_overlap: bool = False
    """Run the shared experts while the routed tokens' all-to-alls are on the links, so
    their compute hides that much of them (--moe-shared-expert-overlap)."""
    overlap_param_gather: bool = False
    """Gather parameters during the next forward (--overlap-param-gather)."""
    overlap_param_gather_with_optimizer_step: bool = False
    """Gather the first model chunk's parameters (one bucket) as soon as its own optimizer
    has stepped, behind the other chunks' steps
    (--overlap-param-gather-with-optimizer-step; interleaved schedules)."""
    moe_token_dispatcher_type: str = "alltoall"
    """How routed tokens reach their experts (--moe-token-dispatcher-type): "alltoall"
    (NCCL all-to-all: a copy per expert), "flex" (DeepEP: a token crosses to each node
    once and is forwarded over NVLink), "allgather" (no expert parallelism)."""
    overlap_moe_expert_parallel_comm: bool = False
    """Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm): one more warm-up
    forward, then each forward runs beside a backward of another microbatch, the
    expert-parallel all-to-alls of each behind the other's compute."""
    delay_wgrad_compute: bool = False
    """In a combined pair, the experts' weight gradients run beside the dispatch's
    backward instead of before it (--delay-wgrad-compute)."""
    moe_flex_dispatcher_num_sms: int | None = None
    """SMs DeepEP's dispatch and combine kernels hold (--moe-flex-dispatcher-num-sms, or
    the older --moe-deepep-num-sms); none: Megatron's 20."""
    ddp_bucket_size: int | None = None
    """Parameters per gradient bucket (Megatron's --ddp-bucket-size); none: Megatron's
    max(40M, 1M x dp x cp)."""
    ddp_num_buckets: int | None = None
    """Gradient buckets per rank (--ddp-num-buckets): each holds the rank's parameters
    // N; not with ddp_bucket_size."""


@dataclass(kw_only=True)
class HardwareConfig:
    preset: str | None = None
    memory_bytes: float = 80e9
    """Device memory one rank may use."""
    p2p_latency_ms: float = 0.0
    p2p_bandwidth_gbps: float = 0.0
    """GB/s (10^9 bytes per second); 0 means transfers are free."""
    peak_tflops: float = 989.0
    fp8_peak_tflops: float = 0.0
    """Dense FP8 peak in TFLOP/s (--fp8-format's matmuls); 0: no FP8 tensor cores."""
    mxfp8: bool = False
    """The tensor cores run MX formats (Blackwell, compute capability 10.0 and up), which
    --fp8-recipe mxfp8 needs."""
    fp8_efficiency_ratio: float = 1.0
    """An FP8 GEMM's fraction of the FP8 peak over a bf16 GEMM's fraction of the bf16
    peak at the same FLOPs (benchmarks/bench_fp8_gemm.py measures it); 1: the bf16 curve."""
    fp4_peak_tflops: float = 0.0
    """Dense FP4 peak in TFLOP/s (NVFP4, --fp4-format's matmuls); 0: no FP4 tensor cores."""
    fp4_efficiency_ratio: float = 1.0
    """An NVFP4 GEMM's fraction of the FP4 peak over a bf16 GEMM's fraction of the bf16
    peak at the same FLOPs; 1: the bf16 curve."""
    efficiency: float = 0.5
    """Matmul fraction of peak, used when matmul_efficiency is empty."""
    matmul_efficiency: list[list[float]] | None = None
    """[[GFLOP of one matmul, fraction of peak], ...]: the efficiency curve, interpolated
    in log GFLOP (ppsim profile --hardware-out measures it); none: `efficiency`."""
    attention_efficiency: float = 0.0
    """FlashAttention's achieved fraction of peak (causal); 0: as a matmul."""
    memory_bandwidth_gbps: float = 0.0
    """Achieved device-memory bandwidth in GB/s for norms, activations, the loss
    (a copy test's figure); 0: memory-bound ops cost nothing."""
    kernel_overhead_us: float = 0.0
    """Least time one kernel takes: host dispatch plus launch, in microseconds."""
    host_link_gbps: float = 0.0
    """Device <-> host bandwidth each way in GB/s (activation offload's copies); 0: free."""
    host_memory_bytes: float = 0.0
    """Host memory of one node that offloaded activations and optimizer state may use;
    0: no limit."""
    host_memory_bandwidth_gbps: float = 0.0
    """The node's host DRAM bandwidth in GB/s, which its GPUs' ranks share when they
    step the optimizer on the host (--optimizer-cpu-offload); 0: unknown."""
    host_core_adam_gparams: float = 0.0
    """Billions of parameters one host core steps a second with torch's fused AdamW in
    fp32 (benchmarks/bench_host_optimizer.py measures it); 0: unknown."""
    gpus_per_node: int = 8
    """GPUs in one node: its NVLink domain (ppsim.job.topology) and the devices sharing
    its host memory (host_memory_bytes)."""
    sm_count: int = 0
    """Streaming multiprocessors per GPU (the SMs a communication kernel holds beside
    compute slow it by their share); 0: unknown, such kernels cost compute nothing."""
    collective_sms: int = 0
    """SMs an NCCL collective across nodes holds while it runs, one per channel (16 on
    a node of 8 NICs); the compute a data-parallel collective hides behind runs on the
    rest. 0: unknown, hidden collectives cost compute nothing."""
    intra_node_bandwidth_gbps: float = 0.0
    """NVLink per GPU per direction, GB/s; 0: inter_node_bandwidth_gbps."""
    intra_node_latency_us: float = 0.0
    """One collective step inside a node; 0: inter_node_latency_us."""
    inter_node_bandwidth_gbps: float = 0.0
    """Each GPU's NIC per direction, GB/s; 0: p2p_bandwidth_gbps."""
    inter_node_latency_us: float = 0.0
    """One collective step across nodes; 0: p2p_latency_ms."""


@dataclass(kw_only=True)
class Config:
    model: Model = field(default_factory=lambda: UniformModel(num_layers=1))
    """The [model] section, typed by kind (ppsim.config.model)."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    costs_file: str | None = None
    """Measured costs (ppsim profile / calibrate) that replace the analytic model."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Which device each rank runs on and which links messages share ([placement])."""
    memory: dict[str, Any] | None = None
    """The [memory] table: a recompute and offload policy (ppsim.policy.model); none: the
    model's global recompute mode."""

    @property
    def num_layers(self) -> int:
        return self.model.num_layers


# ------------------------------------------------------------------ loading


LIST_EXAMPLES = {"split": "[6, 2]", "matmul_efficiency": "[[1, 0.2], [1000, 0.8]]",
                 "devices": "[0, 0]"}
"""A list field's example in the fix of an error that names it."""


def _fill(obj: Any, table: dict[str, Any], section: str) -> None:
    types = {f.name: f.type for f in fields(obj)}
    for key, value in table.items():
        if key not in types:
            raise UserError(f"{section}.{key}", "unknown key", validate.suggest(key, list(types)))
        t = types[key]
        where = f"{section}.{key}"
        if value is None:
            if "None" not in t:  # TOML has no null, but dicts from code and JSON do
                raise UserError(where, "must have a value, got None", f"write a {t}")
            setattr(obj, key, None)
        elif "list" in t:
            if value == "even":
                setattr(obj, key, value)
                continue
            if not isinstance(value, list):
                example = LIST_EXAMPLES.get(key, "[...]")
                raise UserError(where, f"expected a list, got {value!r}"[:200],
                                f"write e.g. {key} = {example}")
            setattr(obj, key, value)  # element checks: validate.pipeline and ppsim.split
        elif t.startswith("int"):
            setattr(obj, key, validate.typed(where, value, int))
        elif t.startswith("float"):
            setattr(obj, key, validate.typed(where, value, float))
        elif t.startswith("bool"):
            setattr(obj, key, validate.typed(where, value, bool))
        else:
            setattr(obj, key, validate.typed(where, value, str))


def config_from_dict(data: dict[str, Any]) -> Config:
    homes = _homes()
    sections.check_homes(data, homes)
    for key in data:
        if key == sections.TOP_LEVEL or key not in homes and \
                key not in homes[sections.TOP_LEVEL]:
            raise UserError(key or '""', "unknown section",
                            "use [model], [pipeline], [hardware], [placement] and [memory]")
    cfg = Config(model=parse_model(validate.table("model", data.get("model", {}))))
    pipeline = validate.table("pipeline", data.get("pipeline", {}))
    _fill(cfg.pipeline, pipeline, "pipeline")
    cfg.pipeline.schedule = schedule_name(cfg.pipeline.schedule)
    if "vpp" not in pipeline and "layout" not in pipeline:  # a V schedule's two, as --schedule
        cfg.pipeline.vpp = chunks_for_schedule(cfg.pipeline.schedule) or cfg.pipeline.vpp
    elif "vpp" in pipeline and "schedule" not in pipeline:  # as --vpp alone: Megatron's
        cfg.pipeline.schedule = schedule_for_vpp(cfg.pipeline.schedule, cfg.pipeline.vpp)
    cfg.hardware = hardware_config(dict(validate.table("hardware", data.get("hardware", {}))))
    _fill(cfg.placement, validate.table("placement", data.get("placement", {})), "placement")
    if "costs_file" in data:
        cfg.costs_file = validate.typed("costs_file", data["costs_file"], str)
    if "memory" in data:
        cfg.memory = dict(validate.table("memory", data["memory"]))
    check_config(cfg)
    return job_shape.resolved(cfg, cfg.pipeline.microbatches if "microbatches" in pipeline
                              else None)


@functools.cache
def _homes() -> dict[str, frozenset[str]]:
    """Each section's valid keys (sections.check_homes)."""
    return {sections.TOP_LEVEL: frozenset({"costs_file"}),
            "model": frozenset({"kind", "preset", "builder", "embedding", "head", *ARCH_FIELDS,
                                *LAYER_FIELDS}),
            "pipeline": frozenset(f.name for f in fields(PipelineConfig)),
            "hardware": frozenset(f.name for f in fields(HardwareConfig)),
            "placement": frozenset(f.name for f in fields(PlacementConfig)),
            "memory": frozenset({"stage", "offload_step_bytes", *POLICY_KEYS})}


def check_config(cfg: Config) -> None:
    """Every field of cfg in range: the one check a loaded or overridden config passes
    (its model was checked when it was parsed)."""
    validate.pipeline(cfg.pipeline)
    validate_hardware.hardware(cfg.hardware)
    validate.placement(cfg.placement)
    if cfg.memory is not None:
        memory_policy(cfg.memory, "none")  # every key and module name checked
        op_sac_memory_refusal(cfg.memory, cfg.model.recompute or "none")
    job_shape.check(cfg)
    combined.check(cfg)


def hardware_config(table: dict[str, Any]) -> HardwareConfig:
    """A [hardware] table, merged onto its preset when it names one."""
    preset = validate.preset_name("hardware.preset", table.get("preset"))
    if preset is not None:
        if preset not in HARDWARE_PRESETS:
            raise UserError("hardware.preset", f"unknown preset {preset!r}",
                            one_of(preset, HARDWARE_PRESETS))
        table = {**HARDWARE_PRESETS[preset], **table}
    hw = HardwareConfig()
    _fill(hw, table, "hardware")
    validate_hardware.hardware(hw)
    return hw


def hardware_choice(choice: str) -> HardwareConfig:
    """--hardware's hardware: a preset's, or a TOML file's [hardware] table (what `ppsim
    calibrate --log` and `ppsim profile --hardware-out` write), whose errors name the file
    (beside --config's [hardware], `hardware.FIELD` alone points at neither)."""
    if not choice.lower().endswith(".toml"):
        return hardware_config({"preset": choice})
    table = hardware_table(choice)
    try:
        return hardware_config(table)
    except UserError as exc:
        raise UserError(f"--hardware {choice}: {exc.field}", exc.problem, exc.fix) from None


def hardware_table(choice: str) -> dict[str, Any]:
    """A --hardware TOML file's [hardware] table."""
    data = parse_toml(files.read_text("--hardware", choice, files.MAX_CONFIG_BYTES,
                                      "TOML [hardware] file"), choice)
    table = data.get("hardware")
    if not isinstance(table, dict):
        raise UserError("--hardware", f"{choice} has no [hardware] table",
                        "give a preset's name (ppsim presets) or a file with a [hardware] "
                        "table, as ppsim calibrate --log writes")
    return table


def parse_toml(text: str, source: str = "config") -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(source, f"malformed TOML: {exc}", "fix the syntax on that line") from None
    except RecursionError:
        raise UserError(source, "malformed TOML: nested too deeply",
                        "a config needs only [model], [pipeline] and [hardware] tables") from None


def load_config(path: str | None, model: dict[str, Any] | None = None) -> Config:
    """Load a config file, or the embedded default when path is None. `model`: the
    [model] table a file without one takes (the command's --preset)."""
    if path is None:
        return config_from_dict(parse_toml(DEFAULT_TOML, "default config"))
    text = files.read_text("--config", path, files.MAX_CONFIG_BYTES, "TOML config file")
    data = parse_toml(text, path)
    if "model" not in data:
        if model is None:
            raise UserError("model", f"{path} has no [model] table",
                            "add [model] with preset = NAME (ppsim presets lists them), or "
                            "give --preset NAME")
        data = {**data, "model": model}
    cfg = config_from_dict(data)
    if cfg.costs_file and not os.path.isabs(cfg.costs_file):
        # A cost file named in a config lives next to that config.
        cfg.costs_file = os.path.join(os.path.dirname(os.path.abspath(path)), cfg.costs_file)
    csv = cfg.pipeline.actions_csv
    if csv and not os.path.isabs(csv):
        cfg.pipeline.actions_csv = os.path.join(os.path.dirname(os.path.abspath(path)), csv)
    return cfg


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The plain (JSON-ready) dict `config_from_dict` reads back to an equal Config."""
    out: dict[str, Any] = {"model": cfg.model.to_dict(),
                           "pipeline": asdict(cfg.pipeline), "hardware": asdict(cfg.hardware),
                           "placement": asdict(cfg.placement)}
    if cfg.costs_file is not None:
        out["costs_file"] = cfg.costs_file
    if cfg.memory is not None:
        out["memory"] = cfg.memory
    return out
