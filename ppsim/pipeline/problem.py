"""Turn a Config into what the simulator needs: costs, split, schedule, limits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ppsim.config import validate
from ppsim.config.limits import SIMULATE, check_ops, check_shape
from ppsim.config.model import TransformerModel, UniformModel
from ppsim.config.schema import Config
from ppsim.costs.costfile import (
    load_conditions,
    load_costs,
    load_p2p,
    load_timed_groups,
    read_cost_file,
)
from ppsim.costs.hybrid import HybridPattern, check_pipeline, parse_pattern, pipe_counts
from ppsim.costs.model import ModelCosts, StageCost, stage_costs, uniform_costs
from ppsim.costs.transformer import accelerator
from ppsim.errors import UserError
from ppsim.job import combined
from ppsim.job.layers import job_costs
from ppsim.job.model import Job, build_job
from ppsim.job.shape import check_gather_chunks
from ppsim.pipeline import split as splits
from ppsim.pipeline.layout import parse_layout
from ppsim.pipeline.messages import delay_ms, wire_ms
from ppsim.pipeline.placement import Topology, topology
from ppsim.pipeline.split import Split, check_stages
from ppsim.policy.setup import fixed_policy
from ppsim.schedules.generators import (
    Schedule,
    build_schedule,
    schedule_for_vpp,
    schedule_placement,
)
from ppsim.schedules.torchcsv import load_actions_csv


@dataclass(frozen=True)
class Hardware:
    memory_bytes: float
    p2p_latency_ms: float = 0.0
    p2p_bandwidth_gbps: float = 0.0
    memory_bandwidth_gbps: float = 0.0
    """Prices the optimizer step (bytes per parameter over this); 0: the step is free."""
    dp: int = 1
    """Data-parallel replicas whose gradients are all-reduced at the end of the step."""
    optimizer_fixed_ms: float = 0.0
    """The optimizer step's time beside its bytes (per-tensor dispatch), per rank;
    measured by `ppsim profile` on CPU."""
    iteration_boundary_ms: float = 0.0
    """Between one iteration's end and the next one's start: the executor's loss
    all-reduce across ranks, as `ppsim profile` measures it; 0 when not measured."""
    job: Job | None = None
    """The whole job (ppsim.job.model): its data-parallel step and its throughput; None
    for a uniform model."""

    def transfer_ms(self, nbytes: int) -> float:
        """Time from send to arrival of one message; 0 when transfers are free."""
        return delay_ms(self.p2p_latency_ms, self.p2p_bandwidth_gbps, nbytes)


@dataclass(frozen=True)
class Problem:
    """A fully resolved pipeline: what `simulate` runs."""

    costs: ModelCosts
    split: Split
    schedule: Schedule
    hardware: Hardware
    topology: Topology | None = None
    """Devices and links the ranks share; None: each rank owns its device and links."""
    pattern: HybridPattern | None = None
    """The hybrid layer pattern the model was built from (its exports place `|`)."""
    memory: Any = None
    """A memory policy's stage costs (ppsim.policy.costs.Fixed or Cheapest); None: the
    model's global recompute mode, in `costs`. With one, `costs` holds the layers
    without recompute: the least time any policy takes (the planner's bounds)."""
    transients: bool = True
    """Count what a B holds while it runs beyond its activations (StageCost.
    transient_bytes); False: only what the ops hold between them, which is what an
    executor's trace samples (tests and benchmarks that compare with one)."""

    @property
    def stage_costs(self) -> list[StageCost]:
        return [self.held(c) for c in stage_costs(self.costs, self.split, self.memory)]

    def held(self, c: StageCost) -> StageCost:
        """A stage's costs as this problem counts them (without its transient where
        `transients` is off)."""
        return c if self.transients or not c.transient_bytes else replace(c, transient_bytes=0)

    def with_split(self, split: Split) -> Problem:
        return replace(self, split=split)


def model_costs(cfg: Config) -> ModelCosts:
    """Costs of the configured model: measured cost file, uniform, or transformer."""
    m = cfg.model
    check_shape(m.num_layers, cfg.pipeline.pp, cfg.pipeline.vpp, cfg.pipeline.microbatches)
    check_stages(cfg.pipeline.pp, cfg.pipeline.vpp)
    if cfg.costs_file:
        return load_costs(cfg.costs_file, m.num_layers,
                          m.fields() if isinstance(m, TransformerModel) else None,
                          m.mtp_layers)
    if isinstance(m, UniformModel):
        if m.layer.weight_grad_ms > m.layer.backward_ms:
            raise UserError("model.weight_grad_ms", "exceeds backward_ms",
                            "weight_grad_ms is the part of backward_ms spent on weights")
        return uniform_costs(m.num_layers, m.layer, m.embedding, m.head)
    job = build_job(cfg)
    assert job is not None  # a transformer model always has a job
    return job_costs(job, accelerator(cfg.hardware))


def mtp_layers(cfg: Config) -> int:
    """MTP layers of the configured model (they follow the decoder layers)."""
    return cfg.model.mtp_layers


def resolve_split(cfg: Config, num_layers: int | None = None,
                  placement: str = "loop") -> Split:
    """The split the pipeline section asks for (see `resolve_split_noted`)."""
    return resolve_split_noted(cfg, num_layers, placement)[0]


def resolve_split_noted(cfg: Config, num_layers: int | None = None,
                        placement: str = "loop") -> tuple[Split, str]:
    """The split the pipeline section asks for, and how it was chosen.

    A list, a layout, Megatron's first/last or account-for options, `split = "even"`
    (Megatron's default, refused when the layers do not divide), or nothing: then
    Megatron's even split where there is one and the near-even split otherwise.
    num_layers counts every layer, MTP included (default: from the model).
    """
    p = cfg.pipeline
    validate.stages(p)  # a split over 0 ranks would divide by zero
    mtp = mtp_layers(cfg)
    total = cfg.num_layers + mtp if num_layers is None else num_layers
    decoder = total - mtp
    first_last = p.first_stage_layers is not None or p.last_stage_layers is not None
    chosen = [name for name, val in (("split", p.split is not None),
                                     ("layout", p.layout is not None),
                                     ("first/last_stage_layers", first_last),
                                     ("account_for_embedding/loss",
                                      p.account_for_embedding or p.account_for_loss)) if val]
    if "layout" in chosen and len(chosen) > 1:
        raise UserError("pipeline.layout", "cannot be combined with " + ", ".join(
            c for c in chosen if c != "layout"), "use the layout alone (Megatron rejects this)")
    if "split" in chosen and len(chosen) > 1:
        raise UserError("pipeline.split", "cannot be combined with " + ", ".join(
            c for c in chosen if c != "split"), "give one way of splitting")
    pattern = hybrid_pattern(cfg)
    if pattern is not None:
        check_pipeline(pattern, p.pp, p.vpp, chosen)
        if pattern.has_pipes and num_layers in (None, pattern_total(pattern)):
            counts = pipe_counts(pattern, p.pp)
            return Split(counts, p.pp, len(counts) // p.pp, placement, mtp), "hybrid pattern"
    if p.layout is not None:
        s = parse_layout(p.layout, p.pp, decoder, mtp)
        if p.vpp not in (1, s.vpp):  # vpp 1 is the default: the layout says how many
            raise UserError("pipeline.vpp", f"is {p.vpp} but the layout has {s.num_stages} "
                            f"stages = {s.vpp} per rank", f"set vpp = {s.vpp} or leave it out")
        return (replace(s, placement=placement) if placement != s.placement else s), "layout"
    if isinstance(p.split, list):
        return splits.split_from_counts(p.split, p.pp, p.vpp, total, placement, mtp), "given"
    if p.split is None and not chosen:
        return splits.default_split(total, p.pp, p.vpp, mtp, placement)  # type: ignore[arg-type]
    s = splits.megatron_split(decoder, p.pp, p.vpp, p.first_stage_layers,
                              p.last_stage_layers, p.account_for_embedding, p.account_for_loss)
    counts = list(s.counts)
    counts[-1] += mtp  # Megatron builds MTP layers on the last stage
    return Split(tuple(counts), s.pp, s.vpp, placement, mtp), "Megatron options"  # type: ignore[arg-type]


def hybrid_pattern(cfg: Config) -> HybridPattern | None:
    """The model's hybrid layer pattern, parsed; None for other models."""
    m = cfg.model
    if isinstance(m, TransformerModel) and m.arch.hybrid_layer_pattern:
        return parse_pattern(m.arch.hybrid_layer_pattern)
    return None


def pattern_total(p: HybridPattern) -> int:
    """Every layer a split of the pattern places, MTP depths included."""
    return len(p.main) + p.mtp_depths


def build_problem(cfg: Config, costs: ModelCosts | None = None) -> Problem:
    """Costs, split, schedule and hardware; cheap checks first, then the big pieces."""
    p = cfg.pipeline
    costs = costs or model_costs(cfg)
    if p.actions_csv:
        return _csv_problem(cfg, costs)
    placement = schedule_placement(p.schedule)
    split = resolve_split(cfg, costs.num_layers, placement)
    name = split_schedule_name(cfg, split)
    pattern = hybrid_pattern(cfg)
    check_ops(p.pp, split.vpp, p.microbatches, False, SIMULATE)
    combined.check_shape(cfg)
    check_gather_chunks(p, split.vpp)
    schedule = build_schedule(name, p.pp, split.vpp, p.microbatches, p.microbatch_group_size,
                              combined=p.overlap_moe_expert_parallel_comm)
    hw = hardware(cfg)
    return with_policy(cfg, Problem(costs, split, schedule, hw, run_topology(cfg, hw),
                                    pattern))


def split_schedule_name(cfg: Config, split: Split) -> str:
    """The schedule that runs `split`: the configured one, interleaved where a layout or a
    hybrid pattern's stages give a rank several chunks (as Megatron runs them); 1F1B for
    a job sharded as torchtitan's FSDP on one stage (torchtitan builds no pipeline at pp
    1, whatever schedule it names)."""
    name, pattern = cfg.pipeline.schedule, hybrid_pattern(cfg)
    arch = getattr(cfg.model, "arch", None)
    if split.pp == 1 and split.vpp == 1 and arch is not None and arch.torchtitan_fsdp:
        return "1f1b"
    if (cfg.pipeline.layout is not None or (pattern and pattern.has_pipes)) and split.vpp > 1:
        return schedule_for_vpp(name, split.vpp)
    return name


def with_policy(cfg: Config, problem: Problem) -> Problem:
    """The problem priced by the config's [memory] policy, when it has one."""
    if cfg.memory is None:
        return problem
    memory = fixed_policy(cfg, problem.split)
    return replace(problem, costs=memory.costs.base, memory=memory)


def run_topology(cfg: Config, hw: Hardware) -> Topology | None:
    """The placement's shared resources (None: the private, classic model). A measured
    cost file supplies the per-message CPU times and the context-switch cost unless the
    placement sets them."""
    pl, cores = cfg.placement, 0
    if cfg.costs_file:
        cond = load_conditions(cfg.costs_file)
        if cond is not None and pl.devices is None:
            cores = cond.cores  # unpinned ranks, and their copies, share the cores
        if cond is not None and cond.message_cpu_ms and not pl.message_cpu_ms:
            pl = replace(pl, message_cpu_ms=cond.message_cpu_ms)
        if cond is not None and cond.context_switch_ms and not pl.context_switch_ms:
            pl = replace(pl, context_switch_ms=cond.context_switch_ms)
        if cond is not None and cond.local_message_cpu_ms and not pl.local_message_cpu_ms:
            pl = replace(pl, local_message_cpu_ms=cond.local_message_cpu_ms)
    topo = topology(pl, cfg.pipeline.pp, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps, cores,
                    hw.dp)
    return None if topo.is_private else topo


def placement_warning(cfg: Config) -> str | None:
    """A line when the cost file's op times were measured for another placement."""
    if not cfg.costs_file:
        return None

    cond = load_conditions(cfg.costs_file)
    if cond is None or not cond.devices:
        return None
    pp = cfg.pipeline.pp
    want = list(cfg.placement.devices) if cfg.placement.devices else list(range(pp))

    def shape(devs: list[int] | tuple[int, ...]) -> tuple[int, int]:
        """(devices busy at once, most ranks on one device): what the profile measured."""
        return len(set(devs)), max(list(devs).count(d) for d in set(devs))

    if shape(want) == shape(cond.devices):
        return None
    return (f"warning: {cfg.costs_file} was profiled for {len(set(cond.devices))} device(s) "
            f"busy at once (placement {list(cond.devices)}), this run places {pp} ranks on "
            f"{len(set(want))} ({want}); re-run ppsim profile with this placement")


def _csv_problem(cfg: Config, costs: ModelCosts) -> Problem:
    """The problem whose order is a torch schedule CSV; its placement shapes the split."""

    p = cfg.pipeline
    # A layout sets vpp itself, so only the CSV's stages per rank are checked against it.
    schedule = load_actions_csv(p.actions_csv, p.pp, None if p.layout else p.vpp,  # type: ignore[arg-type]
                                p.microbatches)
    split = resolve_split(cfg, costs.num_layers, schedule.placement)
    if split.vpp != schedule.vpp:
        raise UserError("pipeline.layout", f"has {split.vpp} stages per rank but the actions "
                        f"CSV runs {schedule.vpp}", "give a layout with as many stages as the CSV")
    hw = hardware(cfg)
    return with_policy(cfg, Problem(costs, split, schedule, hw, run_topology(cfg, hw),
                                    hybrid_pattern(cfg)))


def hardware(cfg: Config) -> Hardware:
    """Memory limit and P2P model; P2P measured in the cost file beats the preset, and its
    latency under load (a message posted as its sender computes on) beats an idle one."""
    latency, bandwidth = cfg.hardware.p2p_latency_ms, cfg.hardware.p2p_bandwidth_gbps
    if cfg.costs_file:
        lat, bw = load_p2p(cfg.costs_file)
        latency = latency if lat is None else lat
        bandwidth = bandwidth if bw is None else bw
    dp = cfg.model.arch.dp if isinstance(cfg.model, TransformerModel) else 1
    membw, fixed, boundary, timed_step = cfg.hardware.memory_bandwidth_gbps, 0.0, 0.0, False
    if cfg.costs_file:
        cond = load_conditions(cfg.costs_file)
        if cond is not None and cond.message_latency_ms:
            # Measured whole for a boundary-sized message: the latency is what the
            # bandwidth term leaves of it.
            nbytes = read_cost_file(cfg.costs_file).layers[0].output_bytes
            latency = max(0.0, cond.message_latency_ms - wire_ms(bandwidth, nbytes))
        if cond is not None and cond.optimizer_gbps > 0:  # the step as measured here
            membw, fixed = cond.optimizer_gbps, cond.optimizer_fixed_ms
            timed_step = isinstance(cfg.model, TransformerModel) \
                and cond.optimizer_kind == cfg.model.arch.optimizer
        if cond is not None and cfg.pipeline.pp * dp > 1:
            boundary = cond.iteration_boundary_ms
    # Collectives with no topology of their own run on the point-to-point link
    # (ppsim.job.topology): the measured one where the cost file has it; the groups'
    # collectives as the file timed them, where it did.
    job = build_job(replace(cfg, hardware=replace(
        cfg.hardware, p2p_latency_ms=latency, p2p_bandwidth_gbps=bandwidth)),
        load_timed_groups(cfg.costs_file) if cfg.costs_file else ())
    if job is not None and timed_step:
        job = replace(job, timed_step=True)
    # DeepEP's buffer and Megatron-FSDP's are the process's, beside the model's: the
    # model has what they leave.
    held = job.deepep_buffer_bytes + job.fsdp_buffer_bytes if job is not None else 0
    hw = Hardware(cfg.hardware.memory_bytes - held, latency, bandwidth, membw, dp, fixed,
                  boundary, job)
    if hw.memory_bytes <= 0:
        raise UserError("hardware.memory_bytes", f"must be positive, got {hw.memory_bytes:g}",
                        "give the memory one rank may use, e.g. 80e9 (--memory-gb 80)")
    if hw.p2p_latency_ms < 0:
        raise UserError("hardware.p2p_latency_ms", "must be >= 0", "use 0 for no latency")
    if hw.p2p_bandwidth_gbps < 0:
        raise UserError("hardware.p2p_bandwidth_gbps", "must be >= 0", "use 0 for free transfers")
    return hw
