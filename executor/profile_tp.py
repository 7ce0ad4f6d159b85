"""`ppsim profile --tp N` on CPU: the pieces measured in N gloo processes at once.

Each process holds its tensor-parallel shard (ppsim.executor.builders.tensor, the layers
the executor runs under `ppsim run --tp N`), so a layer's measured F and B include the
all-reduces its column- and row-parallel linears make, as the run pays them; the cost
file's layers then carry the collectives. The bare collectives are timed too, at the
model's message size (one microbatch's hidden states): all-reduce, all-gather and
reduce-scatter over the same group, so the file says what each costs on its own.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ppsim.costs.costfile import layer_dict
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.executor.builders.llama import architecture
from ppsim.executor.builders.tensor import ALL_GATHER, REDUCE_SCATTER, TensorGroup, set_group
from ppsim.executor.profile import Profiler
from ppsim.executor.spawned import free_port, spawn_results
from ppsim.fileio import write_json_atomic


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
    """Times each op with every tensor rank starting it together (a barrier first): a
    rank's time is then the op and its collectives, not its partner's lag."""

    def __init__(self, inner: Any, group: Any) -> None:
        self.inner, self.group = inner, group

    def time(self, fn: Any) -> tuple[float, Any]:
        dist.barrier(group=self.group)
        return self.inner.time(fn)


def _worker(rank: int, port: int, fields: dict[str, Any], tp: int, repeats: int,
            warmup: int, microbatches: int, out_dir: str) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=tp, timeout=timedelta(seconds=300))
    try:
        group = dist.new_group(list(range(tp)))
        set_group(TensorGroup(group=group, rank=rank, size=tp,
                              sequence_parallel=architecture(fields).sequence_parallel))
        torch.manual_seed(0)
        prof = Profiler(fields, torch.device("cpu"), microbatches)
        prof.clock = _TogetherClock(prof.clock, group)
        prof.run(repeats, warmup)  # every rank runs the same ops: the collectives pair up
        costs, _ = prof.costs()
        coll = time_collectives(group, tp, tuple(prof.builder.activation_shape),
                                prof.builder.dtype, repeats, warmup, start=group)
        write_json_atomic(os.path.join(out_dir, f"{rank}.json"), {
            "layers": [layer_dict(c) for c in costs.layers],
            "embedding": layer_dict(costs.embedding), "head": layer_dict(costs.head),
            "layer_indices": prof.layer_indices, "collectives": coll})
    finally:
        set_group(None)
        dist.destroy_process_group()


def _slowest(docs: list[dict[str, Any]], key: str, i: int | None = None) -> LayerCost:
    """The piece as the slowest rank measured it (the group waits for it)."""
    pieces = [d[key] if i is None else d[key][i] for d in docs]
    worst = max(pieces, key=lambda p: p["forward_ms"] + p["backward_ms"])
    return LayerCost(**worst)


def measure_tensor_parallel(fields: dict[str, Any], tp: int, repeats: int, warmup: int,
                            microbatches: int) -> tuple[ModelCosts, dict[str, Any]]:
    """Per-piece costs of one tensor-parallel rank (the slowest of the tp), and the
    collectives' times as rank 0 measured them, with the layers sampled."""
    with tempfile.TemporaryDirectory(prefix="ppsim-profile-tp-") as out:
        docs = spawn_results(_worker, (free_port(), fields, tp, repeats, warmup,
                                       microbatches, out), tp,
                             [os.path.join(out, f"{r}.json") for r in range(tp)])
    costs = ModelCosts(layers=tuple(_slowest(docs, "layers", i)
                                    for i in range(len(docs[0]["layers"]))),
                       embedding=_slowest(docs, "embedding"), head=_slowest(docs, "head"))
    return costs, {"tp": tp, "backend": "gloo", **docs[0]["collectives"],
                   "layers_sampled": docs[0]["layer_indices"]}
