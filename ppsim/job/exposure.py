"""What a job waits on: the communication its compute does not hide, what held a candidate
back most (memory, the bubble, exposed communication, the host's optimizer step), and the
overlap flags a Megatron job leaves off where they would hide some of it."""

from __future__ import annotations

from dataclasses import replace

from ppsim.costs.model import least_busy_ms
from ppsim.job.layers import job_costs
from ppsim.job.model import Job
from ppsim.pipeline.problem import Problem
from ppsim.sim.summary import Summary, rank_tails


def exposed_comm_ms(problem: Problem, summary: Summary) -> float:
    """The communication an iteration exposes, for the busiest rank: what the job's
    collectives add to every layer over free links, spread evenly over the pipeline ranks
    (the layers' extra over pp, times the m microbatches: an average rank's, not the
    busiest rank's own layers), and the busiest rank's exposed step collectives."""
    job = problem.hardware.job
    if job is None:
        return 0.0
    free = replace(job.network, intra_bandwidth_gbps=0.0, intra_latency_ms=0.0,
                   inter_bandwidth_gbps=0.0, inter_latency_ms=0.0)  # 0: transfers are free
    # Priced as the problem's layers are: a memory policy's base recomputes nothing.
    variant = ((), False) if problem.memory is not None else (None, None)
    alone = job_costs(replace(job, network=free), job.accelerator, *variant)
    # A combined 1F1B hides up to 2 x pair_saving_ms of each layer's in a microbatch.
    extra = sum(least_busy_ms(c) for c in problem.costs.layers) \
        - sum(c.forward_ms + c.backward_ms for c in alone.layers)
    per_rank = extra / problem.schedule.pp * problem.schedule.microbatches
    rank = max(summary.ranks, key=lambda r: r.busy_ms).rank
    if not job.replaces_tail:
        return per_rank
    hw = problem.hardware  # the step's time: the window a first chunk's gather may hide in
    tails = rank_tails(problem.schedule, problem.stage_costs, job, hw.memory_bandwidth_gbps,
                       hw.optimizer_fixed_ms)
    return per_rank + tails[rank].reduce_ms


def held_back(summary: Summary, comm_ms: float, limit: float, host_ms: float = 0.0) -> str:
    """What cost a fitting candidate most, as a share of its iteration: the bubble,
    communication its compute does not hide, or the optimizer's step on the host
    (`host_ms`, its slowest rank's)."""
    if not summary.fits:
        return f"memory ({over_limit_text(summary.peak_memory_bytes, limit)})"
    t = summary.iteration_time_ms
    shares = {"bubble": summary.bubble_fraction, "exposed comm": comm_ms / t if t else 0.0,
              "host optimizer": host_ms / t if t else 0.0}
    worst = max(shares, key=shares.__getitem__)  # ties: the first, the bubble
    if shares[worst] < 0.005:
        return "nothing: compute-bound"
    return f"{worst} {shares[worst]:.0%}"


def over_limit_text(peak: float, limit: float) -> str:
    """"80.3 GB > 80.0": the peak and the limit in GB, to the fewest decimals (one at
    least) at which the peak reads above the limit."""
    digits = 1
    while digits < 6 and round(peak / 1e9, digits) <= round(limit / 1e9, digits):
        digits += 1
    return f"{peak / 1e9:.{digits}f} GB > {limit / 1e9:.{digits}f}"


OVERLAP_HINT_SHARE = 0.05
"""Exposed communication, as a share of the iteration, worth naming the overlaps left
off."""


def overlaps_off(job: Job | None) -> list[str]:
    """Megatron's overlap flags the job leaves off where they would hide some of its
    communication: the data-parallel reduce and gather (not under FSDP, which overlaps one
    unit at a time by itself), and the tensor-parallel collectives (Megatron's jobs:
    torchtitan's FSDP is not one)."""
    if job is None or job.arch.torchtitan_fsdp:
        return []
    s, out = job.shape.sizes, []
    if s.dp * s.cp > 1 and not job.arch.fsdp:
        out += ["--overlap-grad-reduce"] * (not job.overlap_grad_reduce)
        out += ["--overlap-param-gather"] * (job.arch.distributed_optimizer
                                             and not job.overlap_param_gather)
    if s.tp > 1 and not job.tp_comm_overlap:  # which needs sequence parallelism
        out += ["--sequence-parallel"] * (not job.arch.sequence_parallel)
        out.append("--tp-comm-overlap")
    return out


def overlap_hint(job: Job | None, comm_ms: float, iteration_ms: float, who: str,
                 command: str) -> str:
    """A line naming the overlaps `who` leaves off when it waits OVERLAP_HINT_SHARE or
    more of its iteration on communication ("" otherwise); `command` to run again."""
    off = overlaps_off(job)
    if not off or not iteration_ms or comm_ms / iteration_ms < OVERLAP_HINT_SHARE:
        return ""
    verb, them = ("hide", "them") if len(off) > 1 else ("hides", "it")
    return (f"{who} waits {comm_ms / iteration_ms:.0%} of its iteration on communication; "
            f"Megatron's {' '.join(off)}, off here, {verb} part of it: {command} again with "
            f"{them}")
