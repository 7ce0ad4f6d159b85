"""FSDP's collectives of one unit in each microbatch, itemized for `ppsim costs`: each
buffer's gather and gradient reduce-scatter as ppsim.job.fsdp prices them, run as
fsdp.unit_runs says, waiting as ppsim.job.layers.fsdp_collectives decides."""

from __future__ import annotations

from dataclasses import replace

from ppsim.costs.model import LayerCost
from ppsim.job import fsdp
from ppsim.job.comm_rows import EXPOSED, OVERLAPPED, CommRow, link_name
from ppsim.job.layers import fsdp_collectives
from ppsim.job.model import Job
from ppsim.job.traffic import Collective


def _exposure(side: tuple[Collective, ...]) -> str:
    """"overlap" where the unit's compute hides some of that direction's collectives."""
    return OVERLAPPED if side and side[0].exposed_ms < side[0].total_ms else EXPOSED


def fsdp_rows(job: Job, piece: str, cost: LayerCost, head: bool = False,
              edge: bool = False) -> list[CommRow]:
    """One unit's rows (`cost`: its compute alone, as fsdp_collectives takes it); `edge`
    and `head` as there."""
    runs = fsdp.unit_runs(job, head, edge)
    comm = fsdp_collectives(job, cost, head, edge)
    f, b = _exposure(comm.forward), _exposure(comm.backward)
    wide = cost.params - cost.expert_params if edge else 0
    gathers = fsdp.gather_parts(job, cost.params, cost.expert_params, wide)
    plan = [("all-gather", gathers, f, runs.forward_gather),
            ("all-gather", gathers, b, runs.backward_gather),
            ("reduce-scatter", fsdp.reduce_parts(job, cost.params, cost.expert_params), b,
             runs.backward_reduce)]
    out: dict[tuple[str, str, str], CommRow] = {}
    for what, parts, exposure, runs_it in plan:
        for p in parts if runs_it else ():
            name = f"{p.group.removesuffix('_shard')} {what}"
            key = (name, exposure, p.group)
            old = out.get(key)
            out[key] = replace(old, count=old.count + 1) if old else CommRow(
                collective=name, piece=piece, nbytes=p.nbytes, ranks=job.link(p.group).size,
                link=link_name(getattr(job.groups, p.group).crosses_nodes), ms=p.ms,
                count=1, exposure=exposure)
    return list(out.values())
