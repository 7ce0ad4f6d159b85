"""Each rank's process groups: data-, tensor-, context- and the routed experts' (tensor
ranks innermost, then pipeline, then replicas, as Megatron's tp-pp-dp order; a replica's
context-parallel ranks consecutive replicas; the experts folded over a pipeline rank's
tp x cp x dp places, ppsim.executor.places). Shared by `ppsim run`'s ranks and `ppsim
profile`'s processes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch.distributed as dist

from ppsim.executor.builders.context import ContextGroup, set_context
from ppsim.executor.builders.tensor import ExpertGroup, TensorGroup, set_group
from ppsim.executor.places import ExpertShape, expert_places, group_of
from ppsim.executor.runtime import Replica


def pipeline_position(rank: int, pp: int, tp: int) -> int:
    """The pipeline rank global `rank` holds (tensor ranks innermost, then pipeline)."""
    return rank // tp % pp


def rank_groups(rank: int, pp: int, dp: int, a: Any) -> Replica:
    """This rank's replica, its data-parallel group, (tp > 1) its tensor-parallel group
    (splitting the hidden states by tokens under sequence parallelism, its column-parallel
    blocks keeping their gathered inputs as torchtitan's do), (cp > 1) its
    context-parallel group (its attention's traffic, a.cp_comm_type; under a2a+p2p its
    groups of a.cp_a2a_size consecutive ranks and the rings across them) and, for routed
    experts,
    their groups, in Megatron's tp-pp-dp order: tensor ranks innermost, then pipeline,
    then replicas, each replica's cp ranks consecutive (each holds its part of the
    sequence and reduces its gradients with the replicas':
    ppsim.executor.builders.context); the experts fold over a pipeline rank's tp x cp x
    dp places (ppsim.executor.places), in Megatron's order (tp, then cp, then dp). Every
    rank creates every group, in the same order (a collective call)."""
    tp, cp, shape = a.tp, a.cp, ExpertShape.of(a)
    ep, etp = shape.ep, shape.etp
    at = [(r, t) for r in range(pp) for t in range(tp)]
    dp_groups = {(r, t): dist.new_group([(i * pp + r) * tp + t for i in range(dp * cp)])
                 for r, t in at} if dp * cp > 1 else {}
    cp_groups = {(d, r, t): context_groups([((d * cp + c) * pp + r) * tp + t
                                             for c in range(cp)], a.cp_comm_type,
                                            a.cp_a2a_size)
                 for d in range(dp) for r, t in at} if cp > 1 else {}
    tp_groups = {(i, r): dist.new_group([(i * pp + r) * tp + t for t in range(tp)])
                 for i in range(dp * cp) for r in range(pp)} if tp > 1 else {}
    t, r, i = rank % tp, pipeline_position(rank, pp, tp), rank // (tp * pp)
    tensor = TensorGroup(group=tp_groups[(i, r)], rank=t, size=tp,
                         sequence_parallel=a.sequence_parallel,
                         saves_gathered=a.saves_gathered_inputs) if tp > 1 else None
    d, c = divmod(i, cp)
    set_context(cp_groups[(d, r, t)][c] if cp > 1 else None)
    replica = Replica(i, dp * cp, dp_groups.get((r, t)), tp, t, cp=cp)
    if ep <= 1 and etp in (1, tp):  # the experts whole or split over the tensor group
        set_group(tensor, None, tensor if etp == tp else None)
        return replica
    places = expert_places(tp, dp * cp, ep, etp)  # a replica's cp ranks are replicas here

    def groups(lists: list[list[int]]) -> list[list[Any]]:
        """Each pipeline rank's process groups of `lists` (places)."""
        return [[dist.new_group([(q // tp * pp + p) * tp + q % tp for q in g]) for g in lists]
                for p in range(pp)]

    split = groups(places.tensor_groups) if etp not in (1, tp) else None
    shared = groups(places.expert_groups) if ep > 1 else None
    copies = len(places.replica_groups[0])
    held = groups(places.replica_groups) if copies > 1 else None
    q = i * tp + t  # this rank's place among its pipeline rank's tp x cp x dp
    e, k = group_of(places.expert_groups, q), group_of(places.replica_groups, q)
    experts_over = ExpertGroup(group=shared[r][e], rank=places.expert_groups[e].index(q),
                               size=ep) if shared else None
    each_over = tensor if etp == tp else None  # the ranks each expert is split over
    if split:
        each_over = TensorGroup(group=split[r][group_of(places.tensor_groups, q)],
                                rank=q % etp, size=etp)
    set_group(tensor, experts_over, each_over)
    return replace(replica, experts_apart=True, expert_group=held[r][k] if held else None,
                   expert_replicas=copies, expert_index=places.replica_groups[k].index(q))


def context_groups(ranks: list[int], comm: str, a2a: int) -> list[ContextGroup]:
    """Each member's ContextGroup of the context-parallel group of global `ranks`; under
    a2a+p2p with its heads exchanged over `a2a` consecutive members and K and V round the
    members at its place in each of those."""
    cp = len(ranks)
    whole = dist.new_group(ranks)
    if comm != "a2a+p2p":
        return [ContextGroup(group=whole, rank=c, size=cp, comm=comm) for c in range(cp)]
    heads = [dist.new_group(ranks[j:j + a2a]) for j in range(0, cp, a2a)]
    rings = [dist.new_group(ranks[i::a2a]) for i in range(a2a)]
    return [ContextGroup(group=whole, rank=c, size=cp, comm=comm,
                         heads_group=ContextGroup(group=heads[c // a2a], rank=c % a2a,
                                                  size=a2a, comm="a2a"),
                         ring_group=ContextGroup(group=rings[c % a2a], rank=c // a2a,
                                                 size=cp // a2a, comm="p2p"))
            for c in range(cp)]
