"""Every collective a problem's simulation prices, itemized (`ppsim costs`' second table).

Per microbatch: each layer kind's and the embedding's and head's tensor-, context- and
expert-parallel collectives (ppsim.job.comm_rows; none for a cost file, whose measured
layers hold them), and the pipeline's messages, one activation and one gradient across
each boundary between ranks, priced on the link the simulator sends them over. Per
iteration: the data-parallel gradient reduction and parameter gather of the rank whose
step's collectives take longest (ppsim.job.tail), and the tied embedding's all-reduce
between the end stages.
"""

from __future__ import annotations

from ppsim.costs.fp8 import layer_precision
from ppsim.job.comm_rows import EXPOSED, OVERLAPPED, CommRow, edge_rows, link_name, piece_rows
from ppsim.job.layers import compute_costs, per_rank_arch, piece_fp8
from ppsim.job.model import Job
from ppsim.job.traffic import recomputed
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
        rows += layer_rows(job, label_kinds=bool(problem.costs.kinds))
    rows += p2p_rows(problem)
    if job is not None:
        rows += step_rows(problem, job)
    return rows


def layer_rows(job: Job, label_kinds: bool = True) -> list[CommRow]:
    """Each distinct layer kind's collectives (ppsim.job.layers.job_costs's pieces),
    then the embedding's and the head's; `label_kinds`: name pieces by kind (else
    "layer", as the cost table does)."""
    a = per_rank_arch(job.arch)
    costs = compute_costs(job, job.accelerator)
    kinds = costs.kinds or ("dense",) * len(costs.layers)
    again = recomputed(a)
    rows: list[CommRow] = []
    for kind, fp8 in dict.fromkeys(zip(kinds, piece_fp8(a, len(kinds)), strict=True)):
        for row in piece_rows(job, layer_precision(a, fp8), kind if label_kinds else "layer",
                              kind, again):
            if row not in rows:  # a kind in FP8 and in bf16 alike
                rows.append(row)
    return rows + edge_rows(job, a, head=False) + edge_rows(job, a, head=True)


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
    """Per iteration: the data-parallel step's collectives on the rank where they take
    longest, and the tied embedding's all-reduce."""
    s, hw = problem.schedule, problem.hardware
    tails = rank_tails(s, problem.stage_costs, job, hw.memory_bandwidth_gbps,
                       hw.optimizer_fixed_ms)
    rows: list[CommRow] = []
    if any(t.on_links for t in tails):
        r = max(range(len(tails)), key=lambda i: sum(c.total_ms for c in tails[i].on_links))
        rows += [CommRow(collective=STEP_NAMES.get(c.what, c.what), piece="step", rank=r,
                         nbytes=c.nbytes, ranks=job.groups.dp.size,
                         link=link_name(job.groups.dp.crosses_nodes), ms=c.total_ms, count=1,
                         per="iteration",
                         exposure=EXPOSED if c.unhidden_ms >= c.total_ms else OVERLAPPED)
                 for c in tails[r].on_links]
    ends = end_ranks(s)
    sync = job.embedding_sync_ms(ends[0], ends)
    if sync:
        rows.append(CommRow(collective="tied all-reduce", piece="step",
                            nbytes=job.embedding_sync_bytes, ranks=2,
                            link=link_name(job.tied_pair.crosses_nodes), ms=sync, count=1,
                            per="iteration"))
    return rows
