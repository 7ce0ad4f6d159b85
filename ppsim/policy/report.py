"""A problem's memory policy as JSON: one entry per virtual stage."""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

from ppsim.pipeline.problem import Problem
from ppsim.plan.search import SplitSearch
from ppsim.policy.costs import Fixed
from ppsim.policy.megatron import PolicyExport, policy_export
from ppsim.policy.model import ALL_LAYERS, StagePolicy
from ppsim.sim.summary import rank_tails


def one_n(problem: Problem, policies: tuple[StagePolicy, ...]) -> tuple[StagePolicy, ...]:
    """`policies` with one block count N for every stage where one N recomputes on each
    stage the layers its own N does (N is capped at a stage's layers, so N = 9 on a stage
    of 9 and N = 11 on stages of 11 are Megatron's one N = 11, or its uniform method);
    as given otherwise."""
    pc = problem.memory.costs
    stages = problem.split.stages
    if len({p.recompute_layers for p in policies}) < 2:
        return policies
    whole = [pc.recomputed(p, st.offset, st.layers) for p, st in zip(policies, stages,
                                                                     strict=True)]
    for n in (max(whole), ALL_LAYERS):  # the block method, then the uniform one
        same = tuple(replace(p, recompute_layers=n) for p in policies)
        if [pc.recomputed(p, st.offset, st.layers) for p, st in zip(same, stages,
                                                                    strict=True)] == whole:
            return same
    return policies


def policy_flags(problem: Problem, policies: tuple[StagePolicy, ...]) -> PolicyExport:
    """Megatron's flags of the problem's split run with `policies` (and the per-rank
    offload delta the problem is priced with)."""
    pc = problem.memory.costs
    policies = one_n(problem, policies)
    delta = getattr(problem.memory, "delta", None)
    return policy_export(policies, pc.arch, delta.step_bytes if delta else 0)


def with_policy_flags(exports: dict[str, Any], problem: Problem,
                      policies: tuple[StagePolicy, ...]) -> dict[str, Any]:
    """A split's exports (ppsim.pipeline.hybrid_exports.exports_of) with the policy's
    Megatron flags after the split's; `megatron_flags` None, the policy's notes in
    `megatron_note`, where Megatron cannot run the policy (the split's flags alone would
    run another one). `problem`: the problem on that split."""
    ex = policy_flags(problem, policies)
    out = dict(exports)
    if ex.megatron_flags is None:
        out["megatron_flags"], out["megatron_note"] = None, "; ".join(ex.notes)
    elif out["megatron_flags"] is not None and ex.megatron_flags:
        out["megatron_flags"] = f"{out['megatron_flags']} {shlex.join(ex.megatron_flags)}"
    return out


def stage_policies(problem: Problem) -> list[dict[str, Any]]:
    """`{stage, recompute_modules, recompute_layers, offload_modules, offload_fraction}`
    per virtual stage of the problem's split (N capped at the stage's layers)."""
    memory = problem.memory
    split = problem.split
    out = []
    for st in split.stages:
        p = memory.policy_of(st.offset, st.layers, st.index, st.has_embedding, st.has_head,
                             False)
        out.append(p.to_dict(st.index, st.layers))
    return out


def _tails(problem: Problem, job: Any) -> list[Any]:
    """Each rank's step (ppsim.job.tail.Tail) of `problem` run as `job`."""
    hw = problem.hardware
    return rank_tails(problem.schedule, problem.stage_costs, job, hw.memory_bandwidth_gbps,
                      hw.optimizer_fixed_ms)


def optimizer_host_bytes(problem: Problem) -> list[int]:
    """Per rank, the host optimizer's state (ppsim.job.host_optimizer); zeros without it."""
    job = problem.hardware.job
    if job is None or job.host_optimizer is None:
        return [0] * problem.schedule.pp
    return [int(t.host_bytes) for t in _tails(problem, job)]


def host_step_ms(problem: Problem) -> float:
    """The slowest rank's optimizer step where part of it is on the host; 0 otherwise."""
    job = problem.hardware.job
    if job is None or job.host_optimizer is None:
        return 0.0
    return max(t.optimizer_ms for t in _tails(problem, job))


def host_step_line(problem: Problem, iteration_ms: float) -> str | None:
    """With part of the optimizer on the host: its slowest rank's step, and that step with
    as many host threads as reach the rank's share of the node's memory bandwidth and the
    copies beside it, where that is faster; None without it."""
    job = problem.hardware.job
    host = job.host_optimizer if job is not None else None
    if host is None or iteration_ms <= 0:
        return None
    steps = [t.optimizer_ms for t in _tails(problem, job)]
    rank = max(range(len(steps)), key=steps.__getitem__)
    line = (f"the optimizer ({host.fraction:.0%} of its state on the host) steps in "
            f"{steps[rank]:,.0f} ms on rank {rank} ({steps[rank] / iteration_ms:.0%} of the "
            f"iteration) on {host.threads} host thread{'s' * (host.threads > 1)} a rank")
    # Megatron's overlap hides its step's copies; FSDP2's offload has none in the step.
    best = replace(host, threads=max(host.threads, host.saturating_threads),
                   overlap=host.overlap or host.copies)
    faster = max(t.optimizer_ms for t in _tails(problem, replace(job, host_optimizer=best)))
    if faster >= 0.9 * steps[rank]:
        return line
    flags = [f"OMP_NUM_THREADS={best.threads}"] * (best.threads > host.threads) + \
        ["--overlap-cpu-optimizer-d2h-h2d"] * (best.overlap and not host.overlap)
    return f"{line}; {' and '.join(flags)} would take {faster:,.0f} ms"


def host_bytes(problem: Problem, policies: tuple[StagePolicy, ...]) -> list[int]:
    """Per rank, the most host memory its offloaded microbatches hold at once, beside
    the host optimizer's state."""
    pc = problem.memory.costs
    search = SplitSearch(problem)
    out = []
    for r, stages in enumerate(search.rank_stages):
        per = [pc.host_bytes(policies[s], problem.split.stages[s].offset,
                             problem.split.stages[s].layers) for s in stages]
        out.append(search.held_peak(r, per) if any(per) else 0)
    return [a + o for a, o in zip(out, optimizer_host_bytes(problem), strict=True)]


def host_fits(problem: Problem, policies: tuple[StagePolicy, ...]) -> bool:
    """Every rank's offloaded microbatches fit its share of the node's host memory."""
    limit = problem.memory.costs.host_limit_bytes
    return all(h <= limit for h in host_bytes(problem, policies))


def policy_json(problem: Problem) -> dict[str, Any]:
    """{"policy": [...], "host_bytes": per rank, "host_fits"} when the problem runs a
    memory policy, with "optimizer_host_bytes" (and without "policy" where it runs no
    memory policy) when the optimizer is partly on the host; else {}."""
    job = problem.hardware.job
    tails = _tails(problem, job) if job is not None and job.host_optimizer else []
    opt = [int(t.host_bytes) for t in tails]
    out: dict[str, Any] = {"optimizer_host_bytes": opt,
                           "host_optimizer_step_ms": [t.optimizer_ms for t in tails]} \
        if any(opt) else {}
    if isinstance(problem.memory, Fixed):
        held, limit = host_bytes(problem, problem.memory.policies), \
            problem.memory.costs.host_limit_bytes
        out["policy"] = stage_policies(problem)
    elif out:
        assert job is not None and job.host_optimizer is not None  # opt has bytes
        held, limit = opt, job.host_optimizer.host_limit_bytes
    else:
        return {}
    return {**out, "host_bytes": held, "host_fits": all(h <= limit for h in held)}


def host_warning(host: dict[str, Any], hw: Any) -> str | None:
    """A line where what the host holds for a rank (its offloaded activations, the host
    optimizer's state; `host` as policy_json gives it) passes its share of the node's host
    memory (`hw`: the config's hardware); None where it fits."""
    if not host or host["host_fits"]:
        return None
    what = " and ".join(w for w, on in (("offloaded activations", "policy" in host),
                                        ("the host optimizer's state",
                                         "optimizer_host_bytes" in host)) if on)
    return (f"warning: {what} need up to {max(host['host_bytes']) / 1e9:.1f} GB of host "
            f"memory per rank, more than {hw.host_memory_bytes / 1e9:g} GB over "
            f"{hw.gpus_per_node} devices per node allows")


COPY_TID = 2
"""The trace thread of a rank's host copies (tid 0: compute, 1: transfers)."""


def copy_events(sim: Any) -> list[dict[str, Any]]:
    """Chrome trace events of the offload copies on each rank's copy streams, as the
    simulator ran them (ppsim.sim.copies): out after each forward that offloads, back
    before its backward."""
    if sim.timeline is None or not sim.timeline.copies:
        return []
    out: list[dict[str, Any]] = []
    for r in sorted({c.rank for c in sim.timeline.copies}):
        out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": COPY_TID,
                    "args": {"name": "host copies"}})
    for c in sim.timeline.copies:
        kind = "F" if c.direction == "offload" else "B"
        out.append({"name": f"{c.direction} {kind}{c.microbatch}", "cat": "copy", "ph": "X",
                    "pid": c.rank, "tid": COPY_TID, "ts": c.start * 1e3,
                    "dur": (c.end - c.start) * 1e3,
                    "args": {"stage": c.stage, "microbatch": c.microbatch,
                             "bytes": c.nbytes}})
    return out
