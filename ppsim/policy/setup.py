"""A config's memory policy made into stage costs: what `build_problem` attaches."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from ppsim.config.model import TransformerModel
from ppsim.config.schema import Config
from ppsim.costs.transformer import accelerator
from ppsim.errors import UserError
from ppsim.job.host_optimizer import host_share_bytes
from ppsim.job.layers import job_costs, per_rank_arch
from ppsim.job.model import build_job
from ppsim.policy.costs import Fixed, PolicyCosts
from ppsim.policy.megatron import check_recompute
from ppsim.policy.model import MemoryPolicy, StagePolicy, memory_policy, shorthand

if TYPE_CHECKING:
    from ppsim.pipeline.split import Split


def policy_costs(cfg: Config) -> PolicyCosts:
    """The per-module costs of the configured model; only a transformer has op lists."""
    m = cfg.model
    if not isinstance(m, TransformerModel) or cfg.costs_file:
        raise UserError("memory", "a memory policy needs the transformer model's op lists",
                        "drop [memory] and the --recompute-modules/--offload flags, or "
                        "configure a transformer model without a cost file")
    hw = cfg.hardware
    job = build_job(cfg)
    assert job is not None  # a transformer model always has a job
    acc = accelerator(hw)
    # The same pricing as a model without a policy (the job's collectives included); a
    # partial, not a closure, so a plan pickles (the TUI's planner process sends it).
    price = partial(job_costs, job, acc)
    return PolicyCosts(arch=per_rank_arch(job.arch), acc=acc, price=price,
                       host_link_gbps=hw.host_link_gbps,
                       host_limit_bytes=host_share_bytes(hw),
                       combined=job.overlap_moe_expert_parallel_comm,
                       shared_overlap=job.moe_shared_expert_overlap)


def configured_policy(cfg: Config, num_stages: int) -> MemoryPolicy:
    """The [memory] section over the model's global recompute mode."""
    mode = cfg.model.recompute or "none"
    pol = memory_policy(cfg.memory or {}, mode, num_stages) if cfg.memory is not None \
        else MemoryPolicy(default=shorthand(mode))
    arch = getattr(cfg.model, "arch", None)
    if arch is not None:
        for p in (pol.default, *(q for _, q in pol.stages)):
            check_recompute(p.recompute_modules, arch, cfg.pipeline.moe_shared_expert_overlap)
    return pol


def stage_policies(cfg: Config, split: Split, costs: PolicyCosts | None = None
                   ) -> tuple[StagePolicy, ...]:
    """Each virtual stage's configured policy on `split`: a per-rank offload step in bytes
    (Megatron's delta) lowers the offload fraction of rank r's stages by r steps, a step
    being that many bytes over what the first stage offloads a microbatch at fraction 1
    (the inverse of ppsim.policy.megatron.policy_export)."""
    pol = configured_policy(cfg, split.num_stages)
    policies = tuple(pol.of(i) for i in range(split.num_stages))
    if not pol.offload_step_bytes or not pol.default.offloads:
        return policies
    first = split.stages[0]
    whole = replace(pol.of(0), offload_fraction=1.0)
    full = (costs or policy_costs(cfg)).host_bytes(whole, first.offset, first.layers)
    step = pol.offload_step_bytes / full if full else 0.0
    own = {i for i, _ in pol.stages}
    return tuple(p if i in own else replace(p, offload_fraction=max(
        0.0, round(p.offload_fraction - step * (i % split.pp), 12)))
        for i, p in enumerate(policies))


def fixed_policy(cfg: Config, split: Split) -> Fixed:
    """Each virtual stage's configured policy, priced (a hybrid stack's modules act on
    its attention, MLP and MoE layers: ppsim.costs.saved.HYBRID_HALVES)."""
    costs = policy_costs(cfg)
    return Fixed(costs=costs, policies=stage_policies(cfg, split, costs))
