"""Measurements run in several processes, each leaving its result in a JSON file.

gloo can abort a process while it tears down (torch 2.13 on this VM, rarely:
"terminate called without an active exception" after destroy_process_group); a
measurement whose processes all wrote their results before that is still good. Results
are written atomically (ppsim.fileio.write_json_atomic), so a file that exists is
complete.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any


def spawn_results(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int,
                  paths: list[str], *, device_kind: str = "cpu") -> list[Any]:
    """Run `fn(rank, *args)` in `nprocs` processes and read `paths` (the results they
    write with ppsim.fileio.write_json_atomic). A process that died after every result
    was written is reported on stderr and tolerated; any other failure is raised."""
    import torch
    import torch.multiprocessing as mp

    try:
        mp.start_processes(_with_threads_set, args=(fn, *args), nprocs=nprocs, join=True,
                           start_method=start_method(device_kind, torch.cuda.is_initialized()))
    except mp.ProcessExitedException as exc:
        if not all(os.path.exists(p) for p in paths):
            raise
        print(f"ppsim: a measuring process exited abnormally after writing its result "
              f"({exc}); the measurement is kept", file=sys.stderr)
    results = []
    for p in paths:
        with open(p, encoding="utf-8") as fh:
            results.append(json.load(fh))
    return results


def _with_threads_set(rank: int, fn: Callable[..., None], *args: Any) -> None:
    """`fn(rank, *args)` with torch's threads set first (OMP_NUM_THREADS, else 1): a
    forked process that enters an OpenMP parallel region its parent already ran hangs
    (GNU OpenMP's pool does not survive fork), so each measuring process starts from one
    thread per rank, as the executor's ranks run."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    fn(rank, *args)


def start_method(device_kind: str, cuda_initialized: bool) -> str:
    """fork on CPU: each process starts with this one's imports (torch: 1.7 s of CPU
    each under spawn). spawn where the processes use CUDA (a process that has touched
    the driver, even to count devices, cannot fork one that does) or this one has."""
    return "spawn" if device_kind == "cuda" or cuda_initialized else "fork"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a spawned group's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
