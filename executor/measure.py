"""`ppsim profile`'s entry point: the pieces alone, then under the run's conditions, then P2P.

Kept apart from `ppsim.executor.profile` (the piece profiler) and
`ppsim.executor.conditions` (processes at once), which both use the profiler.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import torch

from ppsim.costs.costfile import PROFILE_REPEATS, cost_document, layer_dict
from ppsim.costs.model import ModelCosts
from ppsim.errors import UserError
from ppsim.executor.alloc import keep_freed_memory
from ppsim.executor.builders import builder_spec, code_note
from ppsim.executor.builders.llama import architecture
from ppsim.executor.conditions import cpu_cores, run_conditions
from ppsim.executor.places import ExpertShape
from ppsim.executor.profile import Profiler, Progress, measure_p2p, p2p_sizes
from ppsim.executor.profile_dp import measure_data_parallel
from ppsim.executor.profile_tp import (
    measure_in_processes,
    profile_copies,
    profile_processes,
)


@contextmanager
def builder_blamed(fields: dict[str, Any], flag: str) -> Iterator[None]:
    """A builder of the user's own whose pieces fail while measured (building one, its
    forward or backward): one line naming it and its error, in `flag`'s name."""
    spec = builder_spec(None, fields)
    try:
        yield
    except Exception as exc:
        if code_note(spec) is None:
            raise
        raise UserError(flag, f"{spec}'s pieces failed while profiled: "
                        f"{type(exc).__name__}: {exc}"[:600],
                        "fix the builder; ppsim run with it and --iterations 1 names the "
                        "op that fails") from None


@dataclass(kw_only=True)
class _Measured:
    """The pieces' costs and how they were measured."""

    costs: ModelCosts
    """Under the run's conditions (or, with tp or ep > 1, in their processes)."""
    solo: ModelCosts
    """One process alone (the same as costs with tp or ep > 1)."""
    details: dict[str, Any]
    """Per-piece statistics."""
    sampled: list[int]
    """The decoder layers timed."""
    conditions: dict[str, Any] | None
    """The placement's conditions (ppsim.executor.conditions); None with tp or ep > 1."""
    collectives: dict[str, Any] | None
    """With tp or ep > 1, the bare collectives' times (ppsim.executor.profile_tp)."""


def processes_at_once(fields: dict[str, Any], device_kind: str,
                      devices: list[int] | None) -> int:
    """The most processes that hold a rank's pieces at once while `profile` measures:
    the tensor-, context- and expert-parallel group's copies (`_pieces`), or this process
    with the copies `run_conditions` times beside it (one per device, as many per device
    as the placement puts there)."""
    a = architecture(fields)
    experts = ExpertShape.of(a)
    world = profile_processes(a.tp, experts.ep, experts.etp, a.cp)
    if world > 1:
        return world * (profile_copies(world, len(devices or [0]), os.cpu_count() or 1)
                        if device_kind == "cpu" else 1)
    devs = list(devices) if devices else [0]
    distinct = sorted(set(devs))
    k = max(devs.count(d) for d in distinct)
    at_once = min(len(distinct), cpu_cores()) if device_kind == "cpu" else 0
    return 1 + max(at_once if at_once >= 2 else 0, len(distinct) * k if k >= 2 else 0)


def _pieces(fields: dict[str, Any], device: torch.device, device_kind: str, repeats: int,
            warmup: int, microbatches: int, progress: Progress | None,
            devices: list[int] | None, pin: bool) -> _Measured:
    a = architecture(fields)
    experts = ExpertShape.of(a)
    world = profile_processes(a.tp, experts.ep, experts.etp, a.cp)
    if world > 1:  # the pieces in gloo processes, each holding its shard and experts
        # beside as many copies as the run has pipeline ranks sharing the host's cores
        copies = profile_copies(world, len(devices or [0]), os.cpu_count() or 1) \
            if device_kind == "cpu" else 1
        if progress is not None:
            progress(f"F/B/W in {world} x {copies} tensor-, context- and expert-parallel "
                     "processes", 0)
        costs, coll = measure_in_processes(fields, repeats, warmup, microbatches, copies)
        if progress is not None:
            progress("parallel pieces done", warmup + repeats)
        # No cores recorded: these ops include waits on their peers' collectives, which
        # pooling the cores (ppsim.pipeline.placement) would stretch as if they were work.
        return _Measured(costs=costs, solo=costs, details={}, sampled=coll["layers_sampled"],
                         conditions=None, collectives=coll)
    torch.manual_seed(0)
    prof = Profiler(fields, device, microbatches)
    prof.run(repeats, warmup, progress)
    costs, details = prof.costs()
    conditions, concurrent = run_conditions(prof, fields, device_kind, devices, repeats,
                                            warmup, microbatches, progress, pin)
    return _Measured(costs=concurrent if concurrent is not None else costs, solo=costs,
                     details=details, sampled=prof.layer_indices, conditions=conditions,
                     collectives=None)


def _data_parallel(fields: dict[str, Any], costs: ModelCosts, device_kind: str,
                   devices: list[int] | None, repeats: int, warmup: int,
                   progress: Progress | None) -> dict[str, Any] | None:
    """With dp > 1 on CPU, the data-parallel collectives timed in pp x tp x dp gloo
    processes (ppsim.executor.profile_dp); None otherwise (on a GPU they are NCCL's,
    priced from the hardware's links)."""
    # the gradients reduce over the data- and context-parallel ranks (Megatron's dp-cp)
    dp = int(fields.get("dp", 1)) * int(fields.get("cp", 1))
    if dp <= 1 or device_kind != "cpu":
        return None
    pp, tp = len(devices) if devices else 1, int(fields.get("tp", 1))
    if progress is not None:
        progress(f"data-parallel collectives in {pp * tp * dp} processes", 0)
    params = sum(c.params for c in costs.layers) + costs.embedding.params + costs.head.params
    out = measure_data_parallel(params, pp, dp, str(fields.get("dtype", "fp32")), repeats,
                                warmup, tp)
    if progress is not None:
        progress("data-parallel collectives done", 1)
    return out


def profile(fields: dict[str, Any], device_kind: str = "cpu", repeats: int = PROFILE_REPEATS,
            warmup: int = 3, microbatches: int = 1, p2p: bool = True,
            progress: Progress | None = None,
            devices: list[int] | None = None, pin: bool = False) -> dict[str, Any]:
    """Measure a transformer model; returns a cost file document (see ppsim.costfile).

    On CPU with a placement of several devices (default: one per rank), the op times
    are measured in that many processes at once, as the run will see them, with the
    per-message CPU time and the optimizer step (ppsim.executor.conditions); the solo
    times stay in the measurement for comparison. `pin`: each process on the core of
    its device, as the executor pins ranks of an explicit placement."""
    t0 = time.perf_counter()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)  # what each executor rank uses
    kept = keep_freed_memory()  # as each executor rank does (ppsim.executor.alloc)
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    m = _pieces(fields, device, device_kind, repeats, warmup, microbatches, progress,
                devices, pin)
    costs, solo, details, conditions = m.costs, m.solo, m.details, m.conditions
    link = None
    if p2p:
        if progress is not None:
            progress("P2P ping-pong (2 processes)", 0)
        link = measure_p2p(device_kind, p2p_sizes(costs.hidden_bytes))
        if progress is not None:
            progress("P2P done", 1)
    dp_collectives = _data_parallel(fields, costs, device_kind, devices, repeats, warmup,
                                    progress)
    host_p2p = None
    if link is not None and link.get("staged_via_host"):
        # One GPU: two processes through the host measure no NVLink or InfiniBand link;
        # the cost file keeps no P2P, so the hardware preset's figures stay in force.
        host_p2p, link = link, None
    return cost_document(
        costs, source="profile", model=fields, p2p=link,
        device=device_kind if device_kind == "cpu" else torch.cuda.get_device_name(device),
        torch_version=torch.__version__, host=platform.node(), threads=threads,
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        conditions=conditions,
        **({"collectives": m.collectives} if m.collectives else {}),
        **({"dp_collectives": dp_collectives} if dp_collectives else {}),
        measurement={"repeats": repeats, "warmup": warmup, "layers_sampled":
                     m.sampled, "seconds": time.perf_counter() - t0,
                     "pieces": details, "freed_memory_kept": kept, "p2p_host_mediated": host_p2p,
                     "solo": {"layer": layer_dict(solo.layers[0]),
                              "embedding": layer_dict(solo.embedding),
                              "head": layer_dict(solo.head)}})
