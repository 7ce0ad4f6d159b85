"""Each rank's process groups: data-, tensor- and the routed experts' (Megatron's order:
tensor ranks innermost, then pipeline, then replicas; the experts folded over a pipeline
rank's tp x dp places, ppsim.executor.places). Shared by `ppsim run`'s ranks and
`ppsim profile`'s processes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch.distributed as dist

from ppsim.executor.builders.tensor import ExpertGroup, TensorGroup, set_group
from ppsim.executor.places import ExpertShape, expert_places, group_of
from ppsim.executor.runtime import Replica


def rank_groups(rank: int, pp: int, dp: int, tp: int, sequence_parallel: bool,
                experts: ExpertShape | None = None) -> Replica:
    """This rank's replica, its data-parallel group, (tp > 1) its tensor-parallel group
    (splitting the hidden states by tokens under `sequence_parallel`) and, for routed
    experts, their groups, in Megatron's order: tensor ranks innermost, then pipeline,
    then replicas; the experts fold over a pipeline rank's tp x dp places
    (ppsim.executor.places). Every rank creates every group, in the same order (a
    collective call)."""
    shape = experts or ExpertShape()
    ep, etp = shape.ep, shape.etp
    at = [(r, t) for r in range(pp) for t in range(tp)]
    dp_groups = {(r, t): dist.new_group([(d * pp + r) * tp + t for d in range(dp)])
                 for r, t in at} if dp > 1 else {}
    tp_groups = {(d, r): dist.new_group([(d * pp + r) * tp + t for t in range(tp)])
                 for d in range(dp) for r in range(pp)} if tp > 1 else {}
    t, r, d = rank % tp, (rank // tp) % pp, rank // (tp * pp)
    tensor = TensorGroup(group=tp_groups[(d, r)], rank=t, size=tp,
                         sequence_parallel=sequence_parallel) if tp > 1 else None
    replica = Replica(d, dp, dp_groups.get((r, t)), tp, t)
    if ep <= 1 and etp in (1, tp):  # the experts whole or split over the tensor group
        set_group(tensor, None, tensor if etp == tp else None)
        return replica
    places = expert_places(tp, dp, ep, etp)

    def groups(lists: list[list[int]]) -> list[list[Any]]:
        """Each pipeline rank's process groups of `lists` (places)."""
        return [[dist.new_group([(q // tp * pp + p) * tp + q % tp for q in g]) for g in lists]
                for p in range(pp)]

    split = groups(places.tensor_groups) if etp not in (1, tp) else None
    shared = groups(places.expert_groups) if ep > 1 else None
    copies = len(places.replica_groups[0])
    held = groups(places.replica_groups) if copies > 1 else None
    q = d * tp + t  # this rank's place among its pipeline rank's tp x dp
    i, k = group_of(places.expert_groups, q), group_of(places.replica_groups, q)
    experts_over = ExpertGroup(group=shared[r][i], rank=places.expert_groups[i].index(q),
                               size=ep) if shared else None
    each_over = tensor if etp == tp else None  # the ranks each expert is split over
    if split:
        each_over = TensorGroup(group=split[r][group_of(places.tensor_groups, q)],
                                rank=q % etp, size=etp)
    set_group(tensor, experts_over, each_over)
    return replace(replica, experts_apart=True, expert_group=held[r][k] if held else None,
                   expert_replicas=copies, expert_index=places.replica_groups[k].index(q))
