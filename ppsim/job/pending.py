"""A job shape before it is simulated: its config, its costs, a bound on its time and the
least its fullest rank holds; and, for a shape whose weights and optimizer state alone
overflow memory, the same shape with part of its optimizer on the host
(ppsim.job.host_optimizer): the least part that lets them fit, and all of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ppsim.config.overrides import with_overrides
from ppsim.costs.choices import MEGATRON_FSDP_FLAGS
from ppsim.costs.model import (
    ModelCosts,
    least_busy_ms,
    stage_busy_ms,
    stage_costs,
    static_floor_bytes,
)
from ppsim.costs.state import host_state_share
from ppsim.errors import UserError
from ppsim.job.host_optimizer import (
    host_fields,
    host_rates_known,
    host_share_bytes,
    host_state_bytes,
)
from ppsim.job.shapes import Shape
from ppsim.pipeline.problem import model_costs, resolve_split
from ppsim.pipeline.split import Split
from ppsim.plan.bounds import least_largest_fitting_run
from ppsim.schedules.generators import schedule_for_vpp, schedule_placement

NO_FSDP = {"fsdp_framework": "torchtitan", "fsdp_reshard_after_forward": "default",
           "fsdp_cpu_offload": False}
"""FSDP's fields where a searched shape shards with the distributed optimizer."""
DDP_KNOBS_OFF = {"overlap_grad_reduce": False, "overlap_param_gather": False,
                 "overlap_param_gather_with_optimizer_step": False,
                 "ddp_bucket_size": None, "ddp_num_buckets": None}
"""Megatron DDP's overlaps and buckets, dropped where a searched shape shards with FSDP
(which overlaps one unit at a time; Megatron-FSDP turns its overlaps on itself)."""
HOST_SHARES = (0.25, 0.5, 0.75, 1.0)
"""The shares of each rank's optimizer shard the search may put on the host."""


def shape_config(cfg: Any, s: Shape, gbs: int) -> Any:
    """`cfg` as the shape `s` at a global batch of `gbs`: its sizes, and the axes the
    search varies."""
    schedule = schedule_for_vpp(cfg.pipeline.schedule, s.vpp)  # a --schedule given is kept
    sharding = {"fsdp": s.fully_sharded, "dp_replicas": s.dp_replicas,
                "distributed_optimizer": not s.fully_sharded} if s.sharding else {}
    if s.sharding == "megatron-fsdp":
        sharding |= NO_FSDP | {"fsdp_framework": "megatron-fsdp"}
    elif sharding and not s.fully_sharded:  # FSDP's own fields go with it
        sharding |= NO_FSDP
    dispatcher = {"moe_token_dispatcher_type": s.dispatcher} if s.dispatcher else {}
    cp_comm = {"cp_comm_type": s.cp_comm, "cp_a2a_size": s.cp_a2a} if s.cp_comm else {}
    host = host_fields(s.host_optimizer, _fsdp(cfg, s)) if s.host_optimizer else {}
    # --tp-comm-overlap applies to the shapes with tensor parallelism (Megatron refuses it
    # at tp 1).
    overlap = {"tp_comm_overlap": False} if s.tp == 1 else {}
    if s.sharding and s.fully_sharded:  # Megatron DDP's knobs are not FSDP's to take
        cfg = replace(cfg, pipeline=replace(cfg.pipeline, **DDP_KNOBS_OFF))
    # Every shape splits the activations between the tensor-parallel blocks by tokens
    # (less memory, the same bytes on the links; MoE at tp > 1 needs it).
    return with_overrides(cfg, model={"tp": s.tp, "cp": s.cp, "ep": s.ep, "etp": s.etp, "dp": s.dp,
                                      "micro_batch_size": s.mbs, "sequence_parallel": True,
                                      **sharding, **cp_comm, **host},
                          pipeline={"pp": s.pp, "vpp": s.vpp, "schedule": schedule,
                                    "global_batch_size": gbs, **dispatcher, **overlap},
                          split={})


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A shape before it is simulated: its config, costs and a bound on its time."""

    shape: Shape
    cfg: Any
    """The Config of the shape."""
    costs: ModelCosts
    """Its layer costs, reused when it is simulated."""
    bound_ms: float
    """Its busiest rank's compute alone: no schedule runs it faster."""
    least_ms: float
    """Its busiest rank's compute alone under the most even split of one chunk a rank,
    memory ignored: no split and schedule of those runs it faster (bound_ms with several
    chunks a rank)."""
    static_bytes: int
    """The least weights, gradients and optimizer states its fullest rank holds under any
    split (ppsim.costs.model.static_floor_bytes)."""
    host_bytes: float = 0.0
    """The optimizer state its fullest rank keeps on the host at its default split (with
    the optimizer partly there: ppsim.job.host_optimizer)."""

    @property
    def overflows(self) -> bool:
        """Those bytes alone overflow memory under every split (or, on the host, its
        share of the node's): nothing to simulate."""
        return self.static_bytes > self.cfg.hardware.memory_bytes \
            or self.host_bytes > host_share_bytes(self.cfg.hardware)


def pending_shape(cfg: Any, s: Shape, gbs: int) -> Pending:
    """The shape's costs and bound; UserError when Megatron (or a limit) refuses it."""
    c = shape_config(cfg, s, gbs)
    costs = model_costs(c)
    split = resolve_split(c, costs.num_layers, schedule_placement(c.pipeline.schedule))
    busy = [0.0] * s.pp
    for st, ms in zip(split.stages, stage_busy_ms(costs, split), strict=True):
        busy[split.stage_rank(st.index)] += ms  # each op as short as in a combined pair
    bound = s.microbatches * max(busy)
    return Pending(shape=s, cfg=c, costs=costs, bound_ms=bound,
                   least_ms=_least_ms(costs, split, s.microbatches, bound),
                   static_bytes=static_floor_bytes(costs, s.pp),
                   host_bytes=_host_bytes(c, costs, split))


def _least_ms(costs: ModelCosts, split: Split, microbatches: int, bound_ms: float) -> float:
    """Pending.least_ms: every microbatch, the least largest contiguous run of the pieces'
    least busy times (the embedding, layers, head) over the ranks."""
    if split.num_stages != split.pp:
        return bound_ms
    work = [least_busy_ms(c) for c in (costs.embedding, *costs.layers, costs.head)]
    run = least_largest_fitting_run(work, [(0, 0)] * len(work), [0] * split.pp, math.inf)
    return min(bound_ms, microbatches * (run or 0.0))


def _host_bytes(c: Any, costs: ModelCosts, split: Split) -> float:
    """The optimizer state the fullest rank of `split` keeps on the host (none unless
    `c` puts some there)."""
    if not host_state_share(c.model.arch):
        return 0.0
    dense, experts = [0] * split.pp, [0] * split.pp
    for i, st in enumerate(stage_costs(costs, split)):
        r = split.stage_rank(i)
        dense[r] += st.params - st.expert_params
        experts[r] += st.expert_params
    return max(host_state_bytes(c.model.arch, d, e) for d, e in zip(dense, experts,
                                                                    strict=True))


def host_refusal(cfg: Any) -> None:
    """UserError when no shape of `cfg` could step its optimizer on the host."""
    if not host_rates_known(cfg.hardware):
        raise UserError("--search", "host-optimizer: the [hardware] table does not give the "
                        "host link, DRAM bandwidth and core rate it is priced by",
                        "use a GPU preset (--hardware h100-80gb), or set host_link_gbps, "
                        "host_memory_bandwidth_gbps and host_core_adam_gparams")
    a = cfg.model.arch
    if a.optimizer != "adam":
        raise UserError("--search", "host-optimizer: Megatron steps Adam on the host, not "
                        f"{a.optimizer}", "drop it from --search, or use --optimizer adam")
    if a.fsdp_by_megatron:
        raise UserError("--search", f"host-optimizer: Megatron's "
                        f"{MEGATRON_FSDP_FLAGS[a.fsdp_framework]} offers no CPU offload",
                        "drop it from --search, or use --fsdp")


def _fsdp(cfg: Any, s: Shape) -> bool:
    """The shape shards with FSDP (searched, or as configured)."""
    return s.fully_sharded if s.sharding else cfg.model.arch.fsdp


def host_variants(cfg: Any, shape: Shape, gbs: int) -> list[Pending]:
    """`shape` with part of its optimizer on the host: the least of HOST_SHARES
    under which its weights and optimizer state fit (found by halving), the fastest step,
    and all of it, which leaves the most memory to the activations (under FSDP, FSDP2's CPU
    offload, all of it); none when all of it on the host is not enough. `cfg` is one that
    host_refusal passed."""
    def fits(share: float) -> Pending | None:
        try:
            q = pending_shape(cfg, replace(shape, host_optimizer=share), gbs)
        except UserError:
            return None
        return None if q.overflows else q

    whole = fits(1.0)
    if whole is None or _fsdp(cfg, shape):  # FSDP2 offloads all of it or nothing
        return [whole] if whole is not None else []
    lo, hi, least = 0, len(HOST_SHARES) - 1, whole  # HOST_SHARES[hi] fits
    while lo < hi:
        mid = (lo + hi) // 2
        found = fits(HOST_SHARES[mid])
        if found is None:
            lo = mid + 1
        else:
            hi, least = mid, found
    return [least] if least is whole else [least, whole]
