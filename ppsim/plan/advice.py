"""What to tell a user when no split fits memory (the `plan` command and the TUI say
the same): the lowest peak any split reaches, on which rank, and what to try."""

from __future__ import annotations

import math

from ppsim.config.limits import PLAN, schedule_ops
from ppsim.costs.model import static_floor_bytes
from ppsim.costs.op_sac import OP_SAC
from ppsim.pipeline.problem import Problem
from ppsim.plan.floor import memory_floors
from ppsim.plan.planner import PlanResult
from ppsim.units import fmt_bytes


def no_fit_message(res: PlanResult) -> str:
    """One line: why no split fits (or none was found in the budget) and what to try."""
    p = res.problem
    peak, rank = res.smallest_peak or (0, 0)
    limit = p.hardware.memory_bytes
    floor = res.floor
    if floor is not None and floor.static_bytes > limit:
        return _state_message(res, floor.static_bytes, limit)
    tips = no_fit_tips(p)
    if floor is not None and floor.peak_bytes > limit and p.schedule.vpp > 1:
        # Proven by the floor; no search ran to find the lowest peak itself.
        held = f"{min(floor.inflight)} to {max(floor.inflight)}"
        return (f"no split fits {fmt_bytes(limit)} per rank: some rank of {p.schedule.pp} "
                f"holds at least {floor.peak_bytes / 1e9:.2f} GB (weights, optimizer state "
                f"and the activations of the {held} microbatches a stage holds at once); "
                "try " + ", ".join(tips))
    if peak <= limit or math.isfinite(res.lower_bound_ms):
        # The search stopped at its budget: a split may fit that it did not reach.
        return (f"no split that fits {fmt_bytes(limit)} per rank was found within the time "
                f"budget (the lowest peak seen is {peak / 1e9:.2f} GB on rank {rank}); give "
                "more --time-budget, or try " + ", ".join(tips))
    return (f"no split fits {fmt_bytes(limit)} per rank: the smallest "
            f"peak any split reaches is {peak / 1e9:.2f} GB on rank {rank}; try "
            + ", ".join(tips))


def no_fit_tips(p: Problem, policy_searched: bool = False) -> list[str]:
    """What to try where no split fits: sequence parallelism where tp runs without it,
    more stages, more recompute (more tensor parallelism once the memory policy was
    searched), a smaller micro-batch."""
    more = "more tensor parallelism (--tp)" if policy_searched else _recompute_tip(p)
    return [t for t in (_sequence_tip(p), f"more pipeline stages (--pp {p.schedule.pp * 2})",
                        more, "a smaller micro-batch or fewer microbatches in flight") if t]


def _sequence_tip(p: Problem) -> str | None:
    """Sequence parallelism, where tensor parallelism runs without it: the activations
    between the blocks, whole on every tensor rank, split by tokens."""
    job = p.hardware.job
    if job is None or job.arch.tp == 1 or job.arch.sequence_parallel:
        return None
    return "sequence parallelism (--sequence-parallel)"


def _recompute_tip(p: Problem) -> str | None:
    """What recompute could still take off, from where the problem stands: nothing more
    once every layer recomputes whole (it advised recompute beside --recompute full)."""
    if p.memory is not None:  # a memory policy (modules, block N, offload) is set
        return "a policy that recomputes or offloads more (plan --search policy)"
    job = p.hardware.job
    mode = job.arch.recompute if job is not None else "none"
    if job is not None and (mode == OP_SAC or job.arch.torchtitan_fsdp):  # torchtitan's words
        full = "full activation checkpointing (activation-checkpoint:full, --recompute full)"
        return {"none": "activation checkpointing (activation-checkpoint:selective or :full, "
                        "--recompute op-sac or full)", OP_SAC: full, "selective": full}.get(mode)
    return {"none": "activation recompute (--recompute selective or full)",
            "selective": "full activation recompute (--recompute full)"}.get(mode)


def _state_message(res: PlanResult, floor: int, limit: float) -> str:
    """The weights, gradients and optimizer state alone pass the limit on some rank:
    recompute, micro-batches and time cannot help; fewer of them a rank can."""
    pp, layers = res.problem.schedule.pp, res.problem.costs.num_layers
    need = math.ceil(floor * pp / limit)  # stages that could spread the state within limit
    stages = f"more pipeline stages (--pp {need} at the least)" if need <= layers else None
    job = res.problem.hardware.job
    host = job is not None and job.host_rates_known and job.arch.optimizer == "adam" \
        and not job.arch.fsdp and (job.host_optimizer is None or job.host_optimizer.fraction < 1)
    tips = [t for t in (stages, "more tensor or expert parallelism (--tp, --ep)",
                        "the distributed optimizer over more data-parallel ranks "
                        "(--use-distributed-optimizer, --gpus)",
                        host and "the optimizer on the host (--optimizer-cpu-offload "
                        "--use-precision-aware-optimizer)") if t]
    peak, rank = res.smallest_peak or (0, 0)
    lowest = (f"the smallest peak any split reaches is {peak / 1e9:.2f} GB on rank {rank}; "
              if res.problem.schedule.vpp == 1 and peak else "")
    return (f"no split fits {fmt_bytes(limit)} per rank: {lowest}{_state_alone(floor, pp)} "
            "(recompute cannot help); try " + ", ".join(tips))


def _state_alone(floor: int, pp: int) -> str:
    return (f"weights, gradients and optimizer state alone leave at least "
            f"{floor / 1e9:.2f} GB on some rank of {pp}")


def fit_hint(problem: Problem) -> str:
    """One line for a simulated split that does not fit: whether any split could (the
    memory floor; with the activations only where the planner would take the schedule),
    and what to do."""
    s, limit = problem.schedule, problem.hardware.memory_bytes
    static = static_floor_bytes(problem.costs, s.pp)
    if static > limit:
        return (f"no split fits: {_state_alone(static, s.pp)} (recompute cannot help; "
                "`ppsim plan` says what can)")
    if schedule_ops(s.pp, s.vpp, s.microbatches, s.split_backward) <= PLAN.ops:
        peak = memory_floors(problem).floor.peak_bytes
        if peak > limit:
            tip = _sequence_tip(problem)
            return (f"no split fits: some rank of {s.pp} holds at least {peak / 1e9:.2f} GB "
                    "with its activations in flight; try "
                    + (f"{tip}, " if tip else "") + "recompute, a smaller micro-batch "
                    "or more stages")
    return "another split may fit: `ppsim plan` finds the fastest that does"
