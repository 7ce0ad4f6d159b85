"""Launching through torchrun: the command line, a Slurm script, and running it.

ppsim never starts ranks itself: it runs `python -m torch.distributed.run`
(torchrun) with `-m executor.worker` and the same flags `ppsim run` got, and
reads the rank-0 worker's `ppsim-progress` lines to drive a progress bar.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ppsim.cli import add_config_flags

# Flags the worker needs besides the config flags; launch-only flags stay here.
WORKER_FLAGS = ("device", "iterations", "warmup", "trace_dir", "engine", "inject_fault",
                "timeout_s", "seed", "lr", "dump_grads")


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The `ppsim run` flags that matter to a rank, rebuilt from the parsed namespace."""
    probe = argparse.ArgumentParser(add_help=False)
    add_config_flags(probe)
    out: list[str] = []
    for action in probe._actions:  # argparse has no public action list; read-only use
        value = getattr(args, action.dest, None)
        if not action.option_strings or value is None or value is False:
            continue
        flag = action.option_strings[-1]
        out += [flag] if value is True else [flag, str(value)]
    for dest in WORKER_FLAGS:
        value = getattr(args, dest, None)
        if value is not None:
            out += ["--" + dest.replace("_", "-"), str(value)]
    return out


def torchrun_args(args: argparse.Namespace) -> list[str]:
    if args.nnodes == 1 and args.master_port is None:
        # One node: torchrun picks a free port itself (tests run side by side).
        rdzv = ["--standalone", "--nnodes", "1"]
    else:
        rdzv = ["--nnodes", str(args.nnodes), "--node-rank", str(args.node_rank),
                "--master-addr", args.master_addr, "--master-port",
                str(args.master_port or 29500)]
    return rdzv + ["--nproc-per-node", str(args.nproc_per_node), "--max-restarts", "0",
                   "-m", "executor.worker"]


def launch_command(args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args(args),
            *worker_argv(args)]


def sbatch_script(args: argparse.Namespace) -> str:
    """A Slurm batch script: one torchrun per node, c10d rendezvous on the first node."""
    worker = shlex.join(["-m", "executor.worker", *worker_argv(args)])
    gpus = f"#SBATCH --gpus-per-node={args.nproc_per_node}\n" if args.device == "cuda" else ""
    return (
        "#!/bin/bash\n"
        "#SBATCH --job-name=ppsim-run\n"
        f"#SBATCH --nodes={args.nnodes}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"{gpus}"
        "#SBATCH --time=00:30:00\n"
        "set -euo pipefail\n"
        "# Run from the ppsim checkout (on a shared file system) with its venv active.\n"
        "export OMP_NUM_THREADS=1\n"
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f"MASTER_PORT={args.master_port or 29500}\n"
        'srun torchrun --nnodes "$SLURM_JOB_NUM_NODES" '
        f"--nproc-per-node {args.nproc_per_node} "
        '--rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d '
        '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --max-restarts 0 \\\n'
        f"    {worker}\n"
    )


def print_launch(args: argparse.Namespace) -> None:
    cmd = ["torchrun", *torchrun_args(args), *worker_argv(args)]
    print("# torchrun (run once per node; --node-rank 0..nnodes-1):")
    print("OMP_NUM_THREADS=1 " + shlex.join(cmd))
    print()
    print("# Slurm (save as ppsim-run.sbatch, then: sbatch ppsim-run.sbatch):")
    print(sbatch_script(args), end="")


@dataclass
class Outcome:
    returncode: int
    errors: list[str] = field(default_factory=list)
    """`ppsim-error` lines: the rank and op that failed."""
    aborts: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    """Last lines of other output (torchrun's own report), for a failure."""


def run_torchrun(cmd: list[str], on_progress: Callable[[dict], None],
                 timeout_s: float | None = None) -> Outcome:
    """Run torchrun, feeding progress lines to `on_progress`; never leaves it running."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    out = Outcome(0)
    tail: collections.deque[str] = collections.deque(maxlen=30)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("ppsim-progress "):
                try:
                    msg = json.loads(line.split(" ", 1)[1])
                except ValueError:  # interleaved with another process's output
                    tail.append(line)
                    continue
                on_progress(msg)
            elif line.startswith("ppsim-error: "):
                out.errors.append(line.split(": ", 1)[1])
            elif line.startswith("ppsim-abort: "):
                out.aborts.append(line.split(": ", 1)[1])
            elif line.strip():
                tail.append(line)
        out.returncode = proc.wait(timeout=timeout_s)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        _stop(proc)
        raise
    finally:
        if proc.poll() is None:
            _stop(proc)
    out.tail = list(tail)
    return out


def _stop(proc: subprocess.Popen) -> None:
    """torchrun forwards SIGTERM to its workers; SIGKILL the group if that stalls."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
