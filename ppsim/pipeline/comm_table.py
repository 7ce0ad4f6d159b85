"""Every collective a problem's simulation prices, itemized (`ppsim costs`' second table).

Per microbatch: each layer kind's and the embedding's and head's tensor-, context- and
expert-parallel collectives and FSDP units' gathers and reduce-scatters
(ppsim.job.comm_rows, ppsim.job.fsdp_rows; none for a cost file, whose measured layers
hold them), counted as each stage's [memory] policy recomputes where one is given, and
the pipeline's messages, one activation and one gradient across each boundary between
ranks, priced on the link the simulator sends them over. Per iteration: each pipeline
rank's data-parallel gradient reduction and parameter gather (ppsim.job.tail; ranks
alike share rows), and the tied embedding's all-reduce between the end stages.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppsim.costs.arch import Architecture
from ppsim.costs.fp8 import layer_precision
from ppsim.costs.model import LayerCost
from ppsim.job.comm_rows import EXPOSED, OVERLAPPED, CommRow, edge_rows, link_name, piece_rows
from ppsim.job.fsdp_rows import fsdp_rows
from ppsim.job.layers import compute_costs, per_rank_arch, piece_fp8
from ppsim.job.model import Job
from ppsim.job.step_comm import StepCollective
from ppsim.job.traffic import Recomputed, recomputed
from ppsim.pipeline.problem import Problem
from ppsim.sim.summary import end_ranks, rank_tails

STEP_NAMES = {"gradient reduce-scatter": "dp reduce-scatter",
              "gradient all-reduce": "dp all-reduce",
              "parameter all-gather": "dp all-gather"}


def problem_rows(problem: Problem, layers: bool = True) -> list[CommRow]:
    """The problem's collectives (`layers`: with the layers' own, which a cost file's
    measured times already hold)."""
    job = problem.hardware.job
    rows: list[CommRow] = []
    if job is not None and layers and job.in_microbatches:
        rows += layer_rows(job, label_kinds=bool(problem.costs.kinds),
                           layers=_policy_layers(problem, job))
    rows += p2p_rows(problem)
    if job is not None:
        rows += step_rows(problem, job)
    return rows


@dataclass(frozen=True, kw_only=True)
class RecomputedLayer:
    """A decoder (or MTP) layer as its stage's memory policy recomputes it."""

    index: int
    stage: int
    full: bool
    """Recomputed whole (the stage's first N)."""
    again: Recomputed
    cost: LayerCost
    """Its compute alone under that recompute (what its FSDP unit hides behind)."""


def _policy_layers(problem: Problem, job: Job) -> list[RecomputedLayer] | None:
    """Each layer under its stage's policy, as ppsim.policy.costs.PolicyCosts.stage_cost
    prices it (its first N whole, the rest by module); None without a policy."""
    memory = problem.memory
    if memory is None or not hasattr(memory, "policies"):
        return None
    a = per_rank_arch(job.arch)
    out = []
    for si, st in enumerate(problem.split.stages):
        policy = memory.policies[si]
        n = memory.costs.recomputed(policy, st.offset, st.layers)
        for i in range(st.offset, st.offset + st.layers):
            full = i < st.offset + n
            modules = () if full else policy.recompute_modules
            again = recomputed(replace(a, recompute="full" if full else "none"), modules)
            cost = compute_costs(job, job.accelerator, modules, full).layers[i]
            out.append(RecomputedLayer(index=i, stage=si, full=full, again=again, cost=cost))
    return out


def layer_rows(job: Job, label_kinds: bool = True,
               layers: list[RecomputedLayer] | None = None) -> list[CommRow]:
    """Each distinct layer kind's collectives (ppsim.job.layers.job_costs's pieces),
    then the embedding's and the head's; `label_kinds`: name pieces by kind (else
    "layer", as the cost table does); `layers`: each under its stage's memory policy
    (else the global recompute mode's)."""
    a = per_rank_arch(job.arch)
    plain = compute_costs(job, job.accelerator, *(((), False) if layers else ()))
    kinds = plain.kinds or ("dense",) * len(plain.layers)
    if layers is None:
        layers = [RecomputedLayer(index=i, stage=-1, full=a.recompute == "full",
                                  again=recomputed(a), cost=c)
                  for i, c in enumerate(plain.layers)]
    fp8 = piece_fp8(a, len(kinds))
    stages: dict[CommRow, list[int]] = {}  # each row, the stages running it so
    for layer in layers:
        kind = kinds[layer.index]
        label = kind if label_kinds else "layer"
        ra = layer_precision(replace(a, recompute="full" if layer.full else "none")
                             if layer.stage >= 0 else a, fp8[layer.index])
        for row in (*piece_rows(job, ra, label, kind, layer.again),
                    *fsdp_rows(job, label, layer.cost)):
            seen = stages.setdefault(row, [])
            if layer.stage >= 0 and layer.stage not in seen:
                seen.append(layer.stage)
    rows = [replace(r, stages=tuple(s)) for r, s in stages.items()]
    return rows + _edge_rows(job, a, plain.embedding, head=False) \
        + _edge_rows(job, a, plain.head, head=True)


def _edge_rows(job: Job, a: Architecture, cost: LayerCost, head: bool) -> list[CommRow]:
    piece = "head" if head else "embedding"
    return edge_rows(job, a, head) + fsdp_rows(job, piece, cost, head=head, edge=True)


def p2p_rows(problem: Problem) -> list[CommRow]:
    """The pipeline's messages per microbatch: across each boundary between two ranks,
    the stage's output forward and its gradient backward, on the link the simulator
    prices them on (the [hardware] point-to-point link, or the placement's)."""
    s, costs = problem.schedule, problem.stage_costs
    job, topo = problem.hardware.job, problem.topology
    hops = job.groups.pipeline_hops if job is not None else ()
    out: dict[tuple[int, str], CommRow] = {}
    for i in range(s.num_stages - 1):
        src, dst = s.stage_rank(i), s.stage_rank(i + 1)
        nbytes = costs[i].output_bytes
        if src == dst or not nbytes:
            continue
        ms = topo.link(src, dst).transfer_ms(nbytes) if topo is not None \
            else problem.hardware.transfer_ms(nbytes)
        lo, hi = sorted((src, dst))
        where = link_name(any(hops[lo:hi])) if hops else "p2p"
        row = out.get((nbytes, where))
        out[nbytes, where] = CommRow(
            collective="p2p send", piece="boundary", nbytes=nbytes, ranks=2, link=where,
            ms=ms, count=(row.count if row else 0) + 2, exposure="schedule")
    return list(out.values())


def step_rows(problem: Problem, job: Job) -> list[CommRow]:
    """Per iteration: each pipeline rank's data-parallel step collectives (ranks whose
    rows are alike share them), and the tied embedding's all-reduce."""
    s, hw = problem.schedule, problem.hardware
    tails = rank_tails(s, problem.stage_costs, job, hw.memory_bandwidth_gbps,
                       hw.optimizer_fixed_ms)
    ranks: dict[tuple[CommRow, ...], list[int]] = {}
    for r, tail in enumerate(tails):
        if tail.on_links:
            ranks.setdefault(tuple(_step_row(job, c) for c in tail.on_links), []).append(r)
    rows = [replace(row, pp_ranks=tuple(rs)) for group, rs in ranks.items() for row in group]
    ends = end_ranks(s)
    sync = job.embedding_sync_ms(ends[0], ends)
    if sync:
        rows.append(CommRow(collective="tied all-reduce", piece="step",
                            nbytes=job.embedding_sync_bytes, ranks=2,
                            link=link_name(job.tied_pair.crosses_nodes), ms=sync, count=1,
                            per="iteration"))
    return rows


def _step_row(job: Job, c: StepCollective) -> CommRow:
    return CommRow(collective=STEP_NAMES.get(c.what, c.what), piece="step", nbytes=c.nbytes,
                   ranks=job.groups.dp.size, link=link_name(job.groups.dp.crosses_nodes),
                   ms=c.total_ms, count=1, per="iteration",
                   exposure=EXPOSED if c.unhidden_ms >= c.total_ms else OVERLAPPED)
