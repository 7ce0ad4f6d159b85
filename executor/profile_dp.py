"""`ppsim profile` with dp > 1 on CPU: the data-parallel collectives timed for real.

A run with dp replicas reduces each rank's gradients over its data-parallel group after
the last backward: one all-reduce (DDP), or a reduce-scatter and, after the step, an
all-gather (the distributed optimizer; ppsim.executor.dataparallel). gloo on a CPU does
the reductions with the processor, so no link figure prices them: here they are timed
in (pp x tp) x dp processes at once, the group of every pipeline and tensor position
beside the others as in the run, at buffer sizes around a rank's gradient buffer. The
cost file keeps the samples; ppsim.costs.grouptimes fits each kind's line to them.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ppsim.executor.builders.common import DTYPES
from ppsim.executor.profile_tp import time_collectives
from ppsim.executor.spawned import free_port, spawn_results
from ppsim.fileio import write_json_atomic

SCALES = (0.25, 0.5, 1.0, 2.0)
"""Buffer sizes timed, as multiples of a rank's gradient buffer (the line's span)."""
MIN_BYTES = 4096


def buffer_sizes(params: int, pp: int, element_bytes: int, dp: int) -> list[int]:
    """Buffer sizes to time, in bytes: around one rank's gradient buffer (`params`, one
    tensor-parallel rank's share of the model, over its pipeline ranks), each a whole
    number of elements divisible by dp (reduce-scatter's shards are equal)."""
    per_rank = max(MIN_BYTES, params * element_bytes // max(1, pp))
    step = element_bytes * dp
    return sorted({max(step, int(per_rank * s) // step * step) for s in SCALES})


def _worker(rank: int, port: int, positions: int, dp: int, sizes: list[int],
            dtype_name: str, repeats: int, warmup: int, out_dir: str) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=positions * dp, timeout=timedelta(seconds=300))
    try:
        # Every rank makes every group, in one order (new_group is collective).
        groups = [dist.new_group([s * dp + r for r in range(dp)]) for s in range(positions)]
        mine = groups[rank // dp]
        dtype = DTYPES[dtype_name]
        element = torch.empty((), dtype=dtype).element_size()
        # Every group starts each repeat together (a world barrier), as the run reduces.
        samples = [time_collectives(mine, dp, (n // element,), dtype, repeats, warmup,
                                    start=None) for n in sizes]
        write_json_atomic(os.path.join(out_dir, f"{rank}.json"), samples)
    finally:
        dist.destroy_process_group()


def measure_data_parallel(params: int, pp: int, dp: int, dtype_name: str, repeats: int,
                          warmup: int, tp: int = 1) -> dict[str, Any]:
    """The cost file's `dp_collectives`: each size's times, the mean over the
    pp x tp x dp ranks of each one's median (ppsim.costs.grouptimes reads them)."""
    element = torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    sizes = buffer_sizes(params, pp, element, dp)
    n = pp * tp * dp
    with tempfile.TemporaryDirectory(prefix="ppsim-profile-dp-") as out:
        docs = spawn_results(_worker, (free_port(), pp * tp, dp, sizes, dtype_name,
                                       max(1, repeats), max(1, warmup), out), n,
                             [os.path.join(out, f"{r}.json") for r in range(n)])
    samples = [{"bytes": n, **{k: statistics.fmean(d[i][k] for d in docs)
                               for k in ("all_reduce_ms", "reduce_scatter_ms",
                                         "all_gather_ms")}}
               for i, n in enumerate(sizes)]
    return {"size": dp, "backend": "gloo", "processes": n, "dtype": dtype_name,
            "samples": samples}
