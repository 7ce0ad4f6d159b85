"""A config's memory policy made into stage costs: what `build_problem` attaches."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ppsim.config.model import TransformerModel
from ppsim.config.schema import Config
from ppsim.costs.transformer import accelerator
from ppsim.errors import UserError
from ppsim.job.host_optimizer import host_share_bytes
from ppsim.job.layers import job_costs, per_rank_arch
from ppsim.job.model import build_job
from ppsim.policy.costs import Delta, Fixed, PolicyCosts
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


def stage_policies(cfg: Config, split: Split) -> tuple[StagePolicy, ...]:
    """Each virtual stage's configured policy on `split` (Megatron's per-rank delta
    leaves every microbatch's fraction as it is: Fixed.delta prices it)."""
    pol = configured_policy(cfg, split.num_stages)
    return tuple(pol.of(i) for i in range(split.num_stages))


def fixed_policy(cfg: Config, split: Split) -> Fixed:
    """Each virtual stage's configured policy, priced (a hybrid stack's modules act on
    its attention, MLP and MoE layers: ppsim.costs.saved.HYBRID_HALVES), with Megatron's
    per-rank offload delta where the [memory] section sets one."""
    step = configured_policy(cfg, split.num_stages).offload_step_bytes
    delta = Delta(step_bytes=step, pp=split.pp, vpp=split.vpp,
                  microbatches=cfg.pipeline.microbatches) if step else None
    return Fixed(costs=policy_costs(cfg), policies=stage_policies(cfg, split), delta=delta)
