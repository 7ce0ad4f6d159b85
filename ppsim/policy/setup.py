"""A config's memory policy made into stage costs: what `build_problem` attaches."""

from __future__ import annotations

from ppsim.config.model import TransformerModel
from ppsim.config.schema import Config
from ppsim.costs.model import ModelCosts
from ppsim.costs.transformer import accelerator
from ppsim.errors import UserError
from ppsim.job.layers import job_costs, per_rank_arch
from ppsim.job.model import build_job
from ppsim.policy.costs import Fixed, PolicyCosts
from ppsim.policy.model import MemoryPolicy, memory_policy, shorthand


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

    def price(modules: tuple[str, ...], full: bool) -> ModelCosts:
        # The same pricing as a model without a policy: the job's collectives included.
        return job_costs(job, acc, modules, full)

    return PolicyCosts(arch=per_rank_arch(job.arch), acc=acc, price=price,
                       host_link_gbps=hw.host_link_gbps,
                       host_limit_bytes=hw.host_memory_bytes / max(1, hw.gpus_per_node)
                       if hw.host_memory_bytes > 0 else float("inf"))


def configured_policy(cfg: Config, num_stages: int) -> MemoryPolicy:
    """The [memory] section over the model's global recompute mode."""
    mode = cfg.model.recompute or "none"
    return memory_policy(cfg.memory or {}, mode, num_stages) if cfg.memory is not None \
        else MemoryPolicy(default=shorthand(mode))


def fixed_policy(cfg: Config, num_stages: int) -> Fixed:
    """Each virtual stage's configured policy, priced; a module policy on a hybrid stack
    (whose mixers know no modules: they keep all, or block N recomputes them) refused."""
    pol = configured_policy(cfg, num_stages)
    policies = tuple(pol.of(i) for i in range(num_stages))
    if cfg.model.fields().get("hybrid_layer_pattern") and any(
            p.recompute_modules or p.offload_modules for p in policies):
        raise UserError("memory", "a hybrid layer pattern takes block recompute only "
                        "(its Mamba, GatedDeltaNet and attention layers have no Megatron "
                        "recompute or offload modules here)",
                        "use --recompute-num-layers N (or recompute = \"full\") and drop "
                        "the recompute and offload modules")
    return Fixed(costs=policy_costs(cfg), policies=policies)
