"""`ppsim profile --tp N` (and a MoE's `ep` > 1, and `--cp N`) on CPU: the pieces measured
in gloo processes at once.

Each process holds its tensor-parallel shard (ppsim.executor.builders.tensor, the layers
the executor runs under `ppsim run --tp N`), so a layer's measured F and B include the
all-reduces its column- and row-parallel linears make, as the run pays them; the cost
file's layers then carry the collectives. Under expert parallelism the processes are as
many tensor groups as one expert group spans (lcm(tp, ep x etp) ranks, the experts
folded over them as `ppsim run` folds them, ppsim.executor.places): each holds its
E / ep experts and a MoE layer's F and B include its all-to-alls. At cp > 1 each of those
is cp processes, each holding its part of the sequence (ppsim.executor.builders.context):
an attention layer's F and B include its K/V gathers and scatters. The bare collectives
are timed too, at the model's message size (one microbatch's hidden states; its routed
pairs for the all-to-all): all-reduce, all-gather and reduce-scatter over the tensor
group, so the file says what each costs on its own.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ppsim.costs.attention_shape import attention_shape
from ppsim.costs.costfile import layer_dict
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.executor.builders.context import ContextGroup, context, set_context
from ppsim.executor.builders.llama import architecture
from ppsim.executor.builders.ring import ring_pass
from ppsim.executor.builders.tensor import (
    ALL_GATHER,
    REDUCE_SCATTER,
    ExpertGroup,
    current,
    expert_group,
    set_group,
)
from ppsim.executor.groups import pipeline_position, rank_groups
from ppsim.executor.places import ExpertShape
from ppsim.executor.profile import Profiler
from ppsim.executor.spawned import free_port, spawn_results
from ppsim.fileio import write_json_atomic

PROCESSES_PER_CORE = 8
"""The most processes a core carries in a run on one node (ppsim run refuses more)."""


def _timed_ms(fn: Any, repeats: int, warmup: int, group: Any) -> float:
    """Median ms of `fn` over repeats; every rank of `group` (None: the world) starts each
    together (a barrier)."""
    out = []
    for rep in range(warmup + repeats):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        if rep >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def time_collectives(group: Any, size: int, shape: tuple[int, ...], dtype: torch.dtype,
                     repeats: int, warmup: int, *, start: Any) -> dict[str, float]:
    """All-reduce of a tensor of `shape` over `group` (of `size` ranks), all-gather into
    it and reduce-scatter out of it, each repeat started together by the ranks of
    `start` (None: the world, so that several groups run at once)."""
    whole = torch.randn(shape).to(dtype)
    part = torch.empty(whole.numel() // size, dtype=dtype)
    flat = whole.reshape(-1)[:part.numel() * size].contiguous()
    return {"bytes": whole.numel() * whole.element_size(),
            "all_reduce_ms": _timed_ms(lambda: dist.all_reduce(whole, group=group),
                                       repeats, warmup, start),
            "all_gather_ms": _timed_ms(lambda: ALL_GATHER(flat, part, group=group),
                                       repeats, warmup, start),
            "reduce_scatter_ms": _timed_ms(lambda: REDUCE_SCATTER(part, flat, group=group),
                                           repeats, warmup, start)}


class _TogetherClock:
    """Times each op with every process starting it together (a barrier first): a rank's
    time is then the op and its collectives, not its partners' lag."""

    def __init__(self, inner: Any, group: Any) -> None:
        self.inner, self.group = inner, group

    def time(self, fn: Any) -> tuple[float, Any]:
        dist.barrier(group=self.group)
        return self.inner.time(fn)


def profile_processes(tp: int, ep: int, etp: int, cp: int = 1) -> int:
    """The processes that hold one expert group's tensor groups: lcm(tp, ep x etp), as
    many replicas of a tensor group as one expert group of ep x etp places spans (tp for
    a dense model, or experts split over the tensor group or whole); each of them cp
    times, a context-parallel group's ranks each holding its part of the sequence."""
    return math.lcm(tp, ep * etp) * cp


def time_all_to_all(g: ExpertGroup, shape: tuple[int, ...], dtype: torch.dtype,
                    repeats: int, warmup: int) -> dict[str, float]:
    """One all-to-all of a tensor of `shape` over the expert group, an equal share to
    each rank (the routed pairs of a balanced microbatch)."""
    rows = torch.randn(shape).to(dtype)
    out = torch.empty_like(rows)
    return {"all_to_all_bytes": rows.numel() * rows.element_size(),
            "all_to_all_ms": _timed_ms(lambda: dist.all_to_all_single(out, rows, group=g.group),
                                       repeats, warmup, None)}


def time_context_traffic(g: ContextGroup, elements: int, dtype: torch.dtype, repeats: int,
                         warmup: int, start: Any) -> dict[str, Any]:
    """What a layer's attention sends over its context-parallel group, bare, at one
    microbatch's K and V a rank holds (`elements`): a pass round the ring (p2p), the
    all-gather and the gradients' reduce-scatter (all_gather), the all-to-all (a2a; at
    the K/V bytes), or under a2a+p2p the all-to-all over its heads group and the pass
    round its ring; each repeat started together by the ranks of `start`."""
    rows = torch.randn(max(g.size, elements // g.size * g.size)).to(dtype)  # splits evenly
    out: dict[str, Any] = {"cp": g.size, "cp_comm_type": g.comm,
                           "cp_bytes": rows.numel() * rows.element_size()}

    def over(group: ContextGroup, name: str) -> None:
        if name == "pass":
            out["cp_pass_ms"] = _timed_ms(lambda: ring_pass(rows, group), repeats, warmup,
                                          start)
        elif name == "all_to_all":
            got = torch.empty_like(rows)
            out["cp_all_to_all_ms"] = _timed_ms(
                lambda: dist.all_to_all_single(got, rows, group=group.group), repeats, warmup,
                start)
        else:
            whole = rows.new_empty(rows.numel() * group.size)
            part = torch.empty_like(rows)
            out["cp_all_gather_ms"] = _timed_ms(
                lambda: ALL_GATHER(whole, rows, group=group.group), repeats, warmup, start)
            out["cp_reduce_scatter_ms"] = _timed_ms(
                lambda: REDUCE_SCATTER(part, whole, group=group.group), repeats, warmup, start)

    if g.comm == "a2a+p2p" and g.heads_group is not None and g.ring_group is not None:
        out["cp_a2a_size"] = g.heads_group.size
        over(g.heads_group, "all_to_all")
        over(g.ring_group, "pass")
    else:
        over(g, {"p2p": "pass", "a2a": "all_to_all"}.get(g.comm, "all_gather"))
    return out


def _kv_elements(a: Any) -> int:
    """One microbatch's K and V a tensor- and context-parallel rank holds."""
    sh = attention_shape(a)
    return a.seq_length // a.cp * a.micro_batch_size * (sh.k + sh.v) // a.tp


def _worker(rank: int, port: int, fields: dict[str, Any], world: int, copies: int,
            repeats: int, warmup: int, microbatches: int, out_dir: str) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    a = architecture(fields)
    tp, experts_shape = a.tp, ExpertShape.of(a)
    try:  # `copies` pipeline ranks, each world / (copies x tp x cp) replicas (cp ranks each)
        rank_groups(rank, copies, world // (copies * tp * a.cp), a)
        # each copy's processes start each op together; the copies keep their own pace, as
        # the run's pipeline ranks do
        mine = [dist.new_group([q for q in range(world)
                                if pipeline_position(q, copies, tp) == c])
                for c in range(copies)][pipeline_position(rank, copies, tp)]
        experts = expert_group()
        torch.manual_seed(0)
        prof = Profiler(fields, torch.device("cpu"), microbatches)
        prof.clock = _TogetherClock(prof.clock, mine)
        prof.run(repeats, warmup)  # every rank runs the same ops: the collectives pair up
        costs, _ = prof.costs()
        shape, dtype = tuple(prof.builder.activation_shape), prof.builder.dtype
        coll: dict[str, Any] = {}
        tensor = current()
        if tensor is not None:
            coll = time_collectives(tensor.group, tp, shape, dtype, repeats, warmup, start=mine)
        if experts is not None:
            ep = experts_shape.ep
            pairs = (math.prod(shape[:-1]) // a.token_ranks * a.top_k // ep * ep, shape[-1])
            coll |= time_all_to_all(experts, pairs, dtype, repeats, warmup)
        group = context()
        if group is not None:
            coll |= time_context_traffic(group, _kv_elements(a), dtype, repeats, warmup, mine)
        write_json_atomic(os.path.join(out_dir, f"{rank}.json"), {
            "layers": [layer_dict(c) for c in costs.layers],
            "embedding": layer_dict(costs.embedding), "head": layer_dict(costs.head),
            "tied": layer_dict(costs.tied), "layer_indices": prof.layer_indices,
            "collectives": coll})
    finally:
        set_group(None)
        set_context(None)
        dist.destroy_process_group()


def _slowest(docs: list[dict[str, Any]], key: str, i: int | None = None) -> LayerCost:
    """The piece as the slowest rank measured it (the group waits for it)."""
    pieces = [d[key] if i is None else d[key][i] for d in docs]
    worst = max(pieces, key=lambda p: p["forward_ms"] + p["backward_ms"])
    return LayerCost(**worst)


def profile_copies(group: int, pipeline_ranks: int, cores: int) -> int:
    """How many copies of a measuring group of `group` processes run at once: one per
    pipeline rank the run puts on this host, as many as fit the run's own limit of
    PROCESSES_PER_CORE a core, at least one."""
    return max(1, min(pipeline_ranks, PROCESSES_PER_CORE * cores // group))


def measure_in_processes(fields: dict[str, Any], repeats: int, warmup: int,
                         microbatches: int, copies: int = 1
                         ) -> tuple[ModelCosts, dict[str, Any]]:
    """Per-piece costs of one rank (the slowest of the processes) with its tensor and
    expert parallelism, and the bare collectives' times as rank 0 measured them, with the
    layers sampled. `copies` groups measure at once, as the run's pipeline ranks share
    the host's cores (each group's collectives stay inside it)."""
    a = architecture(fields)
    tp, experts = a.tp, ExpertShape.of(a)
    world = profile_processes(tp, experts.ep, experts.etp, a.cp) * copies
    with tempfile.TemporaryDirectory(prefix="ppsim-profile-tp-") as out:
        docs = spawn_results(_worker, (free_port(), fields, world, copies, repeats, warmup,
                                       microbatches, out), world,
                             [os.path.join(out, f"{r}.json") for r in range(world)])
    costs = ModelCosts(layers=tuple(_slowest(docs, "layers", i)
                                    for i in range(len(docs[0]["layers"]))),
                       embedding=_slowest(docs, "embedding"), head=_slowest(docs, "head"),
                       tied=LayerCost(**docs[0]["tied"]))  # bytes: each rank's alike
    return costs, {"tp": tp, "ep": experts.ep, "etp": experts.etp, "cp": a.cp,
                   "processes": world // copies, "copies": copies,
                   "backend": "gloo", **docs[0]["collectives"],
                   "layers_sampled": docs[0]["layer_indices"]}
