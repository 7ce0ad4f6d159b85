"""Each pipeline stage's collectives, for the trace's and the timeline's communication lane.

A stage's forward runs its layers' tensor-, context- and expert-parallel collectives
(ppsim.job.layers), its backward their mirror; the embedding scatters and the head
gathers once each way; under FSDP without pp each unit's gathers and reduce-scatters
(ppsim.job.fsdp). Per virtual stage and direction this sums, group by group, the time
on the links and the part of it the stage waits for (the rest hides behind its
compute). The step's data-parallel collectives are a rank's, not a stage's
(step_collective_spans): the gradient buckets on the links while the last backward
computes, the parameter gather beside the first forward, what they expose the step's R.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ppsim.costs.fp8 import layer_precision
from ppsim.costs.transformer import Accelerator
from ppsim.job.layers import (
    compute_costs,
    edge_collectives,
    mtp_edge_collectives,
    per_rank_arch,
    piece_collectives,
    piece_fp8,
)
from ppsim.job.model import Job
from ppsim.job.step_comm import StepCollective
from ppsim.job.traffic import Collective, PieceCollectives, recomputed
from ppsim.sim.summary import end_ranks, rank_tails
from ppsim.sim.timing import in_pairs

GROUPS = ("tp", "cp", "ep", "dp")
TIED_SYNC = "embedding gradient all-reduce"
WHAT = {"tp": "all-gather / reduce-scatter", "cp": "K/V ring", "ep": "all-to-all",
        "dp": "FSDP all-gather / reduce-scatter"}
"""What each group's collectives are, as the trace names them."""


@dataclass(frozen=True, kw_only=True)
class StageCollectives:
    """One virtual stage's collectives per microbatch, by group, in each direction."""

    forward: tuple[Collective, ...] = ()
    backward: tuple[Collective, ...] = ()


def _sum(pieces: Sequence[tuple[Collective, ...]]) -> tuple[Collective, ...]:
    total = {g: 0.0 for g in GROUPS}
    exposed = {g: 0.0 for g in GROUPS}
    for piece in pieces:
        for c in piece:
            total[c.group] += c.total_ms
            exposed[c.group] += c.exposed_ms
    return tuple(Collective(group=g, total_ms=total[g], exposed_ms=exposed[g])
                 for g in GROUPS if total[g] > 0)


def stage_collectives(job: Job, acc: Accelerator, stages: Sequence[Any]
                      ) -> list[StageCollectives]:
    """Per stage of `stages` (ppsim.pipeline.split.Stage, virtual-stage order)."""
    a = per_rank_arch(job.arch)
    costs = compute_costs(job, acc)
    kinds = costs.kinds or ("dense",) * len(costs.layers)
    fp8 = piece_fp8(a, len(costs.layers))
    edge = mtp_edge_collectives(job, a, acc)
    embedding = edge_collectives(job, a, acc, costs.embedding)
    head = edge_collectives(job, a, acc, costs.head, head=True)
    by_piece: dict[tuple[str, Any], PieceCollectives] = {}
    out = []
    for st in stages:
        pieces: list[PieceCollectives] = []
        for i in range(st.offset, st.offset + st.layers):
            kind, cost = kinds[i], costs.layers[i]
            if (kind, cost) not in by_piece:
                by_piece[kind, cost] = piece_collectives(
                    job, layer_precision(a, fp8[i]), acc, kind, cost, recomputed(a))
            pieces.append(by_piece[kind, cost])
            if kind == "mtp":  # and its own pass through the head
                pieces.append(edge)
        pieces += [embedding] * st.has_embedding + [head] * st.has_head
        out.append(StageCollectives(forward=_sum([p.forward for p in pieces]),
                                    backward=_sum([p.backward for p in pieces])))
    return out


def in_pair(c: StageCollectives, saving_ms: float) -> StageCollectives:
    """A stage's collectives in an F or B of a combined pair (Schedule.pairs): its
    all-to-alls exposed `saving_ms` less, the rest behind the partner's compute."""
    def cut(side: tuple[Collective, ...]) -> tuple[Collective, ...]:
        return tuple(replace(x, exposed_ms=max(0.0, x.exposed_ms - saving_ms))
                     if x.group == "ep" else x for x in side)
    return StageCollectives(forward=cut(c.forward), backward=cut(c.backward))


def op_collectives(problem: Any, comm: Sequence[StageCollectives], rank: int
                   ) -> list[StageCollectives]:
    """The collectives of each of rank's ops, in its order (`comm`: per stage)."""
    sched = problem.schedule
    together = in_pairs(sched, rank)
    saving = [c.pair_saving_ms for c in problem.stage_costs] if together else []
    return [in_pair(comm[a.stage], saving[a.stage]) if i in together else comm[a.stage]
            for i, a in enumerate(sched.actions[rank])]


def problem_collectives(problem: Any) -> list[StageCollectives]:
    """A Problem's stage collectives; empty for a lone replica or when no group
    communicates in a microbatch (tp = cp = ep = 1, no FSDP without pp)."""
    job = problem.hardware.job
    if job is None or not job.in_microbatches:
        return []
    return stage_collectives(job, job.accelerator, problem.split.stages)


@dataclass(frozen=True, kw_only=True)
class StepCollectiveSpan:
    """Where one of the step's data-parallel collectives runs on a rank's links."""

    what: str
    """As ppsim.job.step_comm.StepCollective names it, or "embedding gradient all-reduce"."""
    start_ms: float
    ms: float
    """Its time on the links."""
    exposed_ms: float
    """The part of it no compute hides (the step's R holds it)."""


def place_step_collectives(on_links: Sequence[StepCollective], first_ms: float,
                           end_ms: float, wait_ms: float = 0.0) -> list[StepCollectiveSpan]:
    """`on_links` of a rank whose first op starts at `first_ms` and last op ends at
    `end_ms`: a collective beside the backward ends its unhidden part after `end_ms`;
    one beside the forward starts with the first op (it gathers what that forward
    needs, the steady state's next iteration); the rest follow the last op, one after
    another, after the gradients' unhidden part, the tied embedding's all-reduce after
    `wait_ms` more (summary.sync_waits)."""
    spans = []
    after = end_ms
    for c in on_links:
        if c.beside == "forward":
            start, stop = first_ms, first_ms + c.total_ms
        elif c.beside == "backward":
            stop = end_ms + c.unhidden_ms
            start, after = max(0.0, stop - c.total_ms), max(after, stop)
        else:
            if c.what == TIED_SYNC:  # a collective: it starts when the other end arrives
                after += wait_ms
            start = after
            stop = after = start + c.total_ms
        spans.append(StepCollectiveSpan(what=c.what, start_ms=start, ms=stop - start,
                                        exposed_ms=c.unhidden_ms))
    return spans


def step_collectives(problem: Any) -> list[tuple[StepCollective, ...]]:
    """Per rank, its step's data-parallel collectives (ppsim.job.tail) in the order they
    run after its last op: the gradients', the tied embedding's all-reduce, then the
    gather; empty for a lone replica."""
    job = problem.hardware.job
    if job is None:
        return []
    hw = problem.hardware
    tails = rank_tails(problem.schedule, problem.stage_costs, job, hw.memory_bandwidth_gbps,
                       hw.optimizer_fixed_ms)
    out = []
    ends = end_ranks(problem.schedule)
    for r, tail in enumerate(tails):
        sync = job.embedding_sync_ms(r, ends)
        tied = (StepCollective(what=TIED_SYNC, total_ms=sync,
                               unhidden_ms=sync),) if sync > 0 else ()
        # Megatron reduces the tied embedding's gradients once the buckets are reduced,
        # before the optimizer steps and gathers.
        grads = tuple(c for c in tail.on_links if c.what.startswith("gradient"))
        rest = tuple(c for c in tail.on_links if not c.what.startswith("gradient"))
        out.append(grads + tied + rest)
    return out


def step_collective_spans(problem: Any, timeline: Any) -> list[list[StepCollectiveSpan]]:
    """Per rank of a recorded simulation (ppsim.sim.engine.Timeline), where its step's
    data-parallel collectives (step_collectives) run: a list for every rank, empty where
    none does (a lone replica, a uniform model); no list without a timeline."""
    if timeline is None or not timeline.step:
        return []
    ranks = step_collectives(problem) or [()] * len(timeline.ops)
    waits = timeline.sync_waits or (0.0,) * len(timeline.ops)
    return [place_step_collectives(mine, ops[0].start if ops else 0.0, step[0], wait)
            for mine, ops, step, wait in zip(ranks, timeline.ops, timeline.step, waits,
                                             strict=True)]
