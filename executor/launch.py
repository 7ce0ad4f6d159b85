"""Launching through torchrun: the command line, a Slurm script, and running it.

ppsim never starts ranks itself: it writes the run spec (ppsim.executor.runspec)
into the run's folder and runs torchrun (`torch.distributed.run`'s main, in a
process forked from this one: ppsim.executor.forked). On CPU torchrun forks each
rank and runs the worker script in it (`--start-method fork --run-path`), so a
rank starts with torch already imported, which is most of a small run's start-up.
With CUDA (`rank_start`), and in the printed launch and the Slurm script, torchrun
starts each rank as `python -P -u -m ppsim.executor.worker --spec PATH` instead.
It reads the rank-0 worker's `ppsim-progress` lines to drive a progress bar.
`-P` (Python >= 3.11) keeps the working directory off the import path, so a
user's folder named `ppsim`, `executor` or `torch` is never imported instead.

On one node `ppsim run` hosts the job's TCP store itself, bound to the master
address (127.0.0.1 by default) rather than every interface as torchrun's own
stores are; torchrun joins it as a client and the ranks build their process
group on it (`PPSIM_STORE`). Multi-node jobs use torchrun's static rendezvous.
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ppsim.errors import UserError
from ppsim.executor import forked

STORE_ENV = "PPSIM_STORE"
"""host:port of the store `ppsim run` hosts; the worker builds its process group on it."""
SPEC_END = "PPSIM_RUN_SPEC"
"""The here-document delimiter a printed launch writes the spec with (no JSON line is it)."""


def worker_command(spec_path: str, python: str = sys.executable) -> list[str]:
    """How a printed torchrun starts each rank (`--no-python`: the interpreter and its flags
    are ours)."""
    return ["--no-python", python, "-P", "-u", "-m", "ppsim.executor.worker", "--spec",
            _as_argument(spec_path)]


def forked_worker(spec_path: str) -> list[str]:
    """How `ppsim run`'s torchrun starts each rank by default on CPU: forked from torchrun,
    the worker script run in it."""
    import importlib.util

    script = importlib.util.find_spec("ppsim.executor.worker").origin  # type: ignore[union-attr]
    return ["--start-method", "fork", "--run-path", str(script), "--spec",
            _as_argument(spec_path)]


def _as_argument(path: str) -> str:
    """A path the worker's parser reads as --spec's value: one that starts with "-" (a
    --trace-dir named "-out") would read as an option, and every rank exit 2."""
    return os.path.join(".", path) if path.startswith("-") else path


def torchrun_args(args: argparse.Namespace, store: tuple[str, int] | None = None) -> list[str]:
    """torchrun's flags: joining the store `ppsim run` hosts, or static rendezvous."""
    if store is not None:
        host, port = store
        endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        # is_host=false: torchrun is a client of our store and opens none of its own.
        rdzv = ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                "--rdzv-id", f"ppsim-{os.getpid()}-{port}", "--rdzv-conf", "is_host=false",
                "--local-addr", host]
    elif args.nnodes == 1 and args.master_port is None:
        rdzv = ["--standalone", "--nnodes", "1"]
    else:
        rdzv = ["--nnodes", str(args.nnodes), "--node-rank", str(args.node_rank),
                "--master-addr", args.master_addr, "--master-port",
                str(args.master_port or 29500)]
    return rdzv + ["--nproc-per-node", str(args.nproc_per_node), "--max-restarts", "0"]


def torchrun_argv(args: argparse.Namespace, spec_path: str,
                  store: tuple[str, int] | None = None) -> list[str]:
    """torchrun's command line, after `torchrun`, as `ppsim run` runs it."""
    ranks = forked_worker(spec_path) if rank_start(args) == "fork" else \
        worker_command(spec_path)
    return [*torchrun_args(args, store), *ranks]


def rank_start(args: argparse.Namespace) -> str:
    """--rank-start, or its default: fork on CPU; exec with CUDA, where ppsim run has
    touched the driver (a forked process could not use it) and start-up is not the cost."""
    return getattr(args, "rank_start", None) or ("exec" if args.device == "cuda" else "fork")


def launch_command(args: argparse.Namespace, spec_path: str,
                   store: tuple[str, int] | None = None) -> list[str]:
    """The same as a command (`ppsim run` forks torchrun rather than exec it: forked.py)."""
    return [sys.executable, "-P", "-m", "torch.distributed.run",
            *torchrun_argv(args, spec_path, store)]


def spec_script(spec_path: str, spec_json: str) -> str:
    """Shell lines that write the run spec where the printed launch reads it."""
    folder = os.path.dirname(spec_path) or "."
    return (f"mkdir -p {shlex.quote(folder)}\n"
            f"cat > {shlex.quote(spec_path)} <<'{SPEC_END}'\n{spec_json}\n{SPEC_END}\n")


class JobStore:
    """The job's TCP store, hosted in this process and listening on one address only."""

    def __init__(self, addr: str, port: int | None) -> None:
        import socket
        from datetime import timedelta

        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr, port or 0))
            sock.listen(128)
        except (OSError, OverflowError) as exc:
            sock.close()
            if getattr(exc, "errno", None) == errno.EADDRINUSE:
                raise UserError("--master-port", f"port {port} is already in use",
                                "pick another port, or leave --master-port out for a free "
                                "one") from None
            raise UserError("--master-addr", f"cannot listen on {addr}: "
                            f"{getattr(exc, 'strerror', None) or exc}",
                            "give an address of this machine, e.g. 127.0.0.1") from None
        self.addr, self.port = addr, sock.getsockname()[1]
        import torch.distributed as dist

        # The store takes the listening socket over (detach: Python must not close it).
        self.listen_fd = sock.detach()
        """The listening socket's descriptor: torchrun, forked from here, closes its copy."""
        self.store = dist.TCPStore(addr, self.port, is_master=True, wait_for_workers=False,
                                   master_listen_fd=self.listen_fd,
                                   timeout=timedelta(seconds=60))

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.addr, self.port

    def close(self) -> None:
        del self.store


def check_port_free(addr: str, port: int) -> None:
    """Multi-node, node 0: torchrun will listen on `port`; say so now if it cannot."""
    import socket

    with socket.socket() as sock:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError("--master-port", f"port {port} is already in use on this "
                                "node", "pick another --master-port for every node") from None


def sbatch_script(args: argparse.Namespace, spec_path: str, spec_json: str) -> str:
    """A Slurm batch script: the run spec, then one torchrun per node, c10d rendezvous on
    the first node."""
    worker = shlex.join(worker_command(spec_path, "python"))
    gpus = f"#SBATCH --gpus-per-node={args.nproc_per_node}\n" if args.device == "cuda" else ""
    return (
        "#!/bin/bash\n"
        "#SBATCH --job-name=ppsim-run\n"
        f"#SBATCH --nodes={args.nnodes}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"{gpus}"
        "#SBATCH --time=00:30:00\n"
        "set -euo pipefail\n"
        "# Run with ppsim's venv active, from a directory on a shared file system.\n"
        "export OMP_NUM_THREADS=1\n"
        "# The run spec every rank reads, as ppsim run writes it.\n"
        f"{spec_script(spec_path, spec_json)}"
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f"MASTER_PORT={args.master_port or 29500}\n"
        'srun torchrun --nnodes "$SLURM_JOB_NUM_NODES" '
        f"--nproc-per-node {args.nproc_per_node} "
        '--rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d '
        '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --max-restarts 0 \\\n'
        f"    {worker}\n"
    )


def print_launch(args: argparse.Namespace, spec_path: str, spec_json: str) -> None:
    """The launch `ppsim run` would make, as commands to run by hand; writes nothing."""
    cmd = ["torchrun", *torchrun_args(args), *worker_command(spec_path, "python")]
    print("# the run spec every rank reads (write it once, where every node sees it):")
    print(spec_script(spec_path, spec_json))
    if args.nnodes == 1:
        print("# torchrun:")
        print("OMP_NUM_THREADS=1 " + shlex.join(cmd))
    else:
        print(f"# torchrun, the same line on each node, with NODE_RANK set to 0..{args.nnodes - 1}"
              + (" and MASTER_ADDR to node 0's address:" if _loopback(args.master_addr)
                 else ":"))
        print("OMP_NUM_THREADS=1 " + _per_node(cmd, args.master_addr))
    print()
    print("# Slurm (save as ppsim-run.sbatch, then: sbatch ppsim-run.sbatch):")
    print(sbatch_script(args, spec_path, spec_json), end="")


def _loopback(addr: str) -> bool:
    return addr in ("127.0.0.1", "localhost", "::1")


def _per_node(cmd: list[str], master_addr: str) -> str:
    """The torchrun line with the node's rank (and, where --master-addr was left at this
    machine's loopback, which no other node reaches, node 0's address) as shell variables."""
    out = list(cmd)
    out[out.index("--node-rank") + 1] = "$NODE_RANK"
    if _loopback(master_addr):
        out[out.index("--master-addr") + 1] = "$MASTER_ADDR"
    return " ".join(f'"{a}"' if a.startswith("$") else shlex.quote(a) for a in out)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, limit: int = 2000) -> str:
    """A line from a rank or torchrun, safe for a terminal: control characters escaped."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


@dataclass
class Outcome:
    returncode: int
    errors: list[str] = field(default_factory=list)
    """`ppsim-error` lines: the rank and op that failed."""
    aborts: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    """Last lines of other output (torchrun's own report), for a failure."""
    exits: dict[int, int] = field(default_factory=dict)
    """rank -> exit code of each failed rank in torchrun's report (negative: signal)."""
    finished: set[int] = field(default_factory=set)
    """Ranks that said `ppsim-finished`: past the last barrier, every file written."""

    def died_after_finishing(self) -> list[str]:
        """For a failed launch whose ranks all finished their work first (gloo can
        abort a process in its teardown, rarely): one warning per such rank; empty when
        the failure is real."""
        if self.returncode == 0 or self.errors or self.aborts or not self.exits:
            return []
        failed = {r: c for r, c in self.exits.items() if c != 0}
        if not failed or not set(failed) <= self.finished:
            return []
        return [f"rank {r} {_exit_text(c)} after finishing its work (in torch.distributed's "
                "teardown); the run's results are complete" for r, c in sorted(failed.items())]


_RECORD_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\b")
_RECORD_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\b")


def run_torchrun(argv: list[str], on_progress: Callable[[dict], None], *,
                 env_extra: dict[str, str] | None = None, close_fds: Sequence[int] = (),
                 preload: Sequence[str] = ()) -> Outcome:
    """Run torchrun with `argv`, forked from this process with `preload` imported first,
    feeding progress lines to `on_progress`; never leaves it running."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(env_extra or {})
    forked.preload(preload)
    return follow(forked.ForkedProcess(forked.torchrun(argv), env, close_fds=close_fds),
                  on_progress)


def follow(proc: Any, on_progress: Callable[[dict], None]) -> Outcome:
    """Read a torchrun's output to its end (a Popen, or a ForkedProcess); stop it on
    Ctrl-C or an error."""
    out = Outcome(0)
    tail: collections.deque[str] = collections.deque(maxlen=30)
    record_rank: int | None = None
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
            elif line.startswith("ppsim-finished "):
                try:
                    out.finished.add(int(json.loads(line.split(" ", 1)[1])["rank"]))
                except (ValueError, KeyError, TypeError):
                    tail.append(line)
            elif line.startswith("ppsim-error: "):
                out.errors.append(line.split(": ", 1)[1])
            elif line.startswith("ppsim-abort: "):
                out.aborts.append(line.split(": ", 1)[1])
            elif line.strip():
                tail.append(line)
                # torchrun's failure report: "rank : 1 (local_rank: 1)" then "exitcode : -9".
                if m := _RECORD_RANK.match(line):
                    record_rank = int(m.group(1))
                elif (m := _RECORD_EXIT.match(line)) and record_rank is not None:
                    out.exits[record_rank] = int(m.group(1))
                    record_rank = None
        out.returncode = proc.wait()
    finally:  # Ctrl-C or an error while reading: never leave torchrun running
        if proc.poll() is None:
            _stop(proc)
    out.tail = list(tail)
    return out


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exited with status {code}"


def _also(errors: list[str]) -> list[str]:
    """Notes for the errors after the first: the ranks that failed as the first did in
    one line, each other error whole."""
    def what(line: str) -> str:
        return re.sub(r"^rank \d+ ", "", line)

    same = sorted(int(m.group(1)) for e in errors[1:] if what(e) == what(errors[0])
                  and (m := re.match(r"rank (\d+) ", e)))
    notes = [f"also: {e}" for e in errors[1:] if what(e) != what(errors[0])]
    return notes + ([f"rank(s) {', '.join(map(str, same))} failed the same way"] if same
                    else [])


def _reporting_ranks(lines: list[str], pattern: str) -> set[int]:
    return {int(m.group(1)) for line in lines if (m := re.match(pattern, line))}


def failure_lines(out: Outcome) -> tuple[list[str], list[str]]:
    """(error lines, note lines) for a failed run: the cause first, consequences as notes.

    A rank that printed `ppsim-error` names its op. A rank that died without a
    word (SIGKILL, the OOM killer) is named from torchrun's record, and the
    errors the others then hit (a reset connection) are its consequences.
    """
    failed = _reporting_ranks(out.errors, r"rank (\d+) failed")
    aborted = _reporting_ranks(out.aborts, r"rank (\d+) stopping") - failed
    reported = failed | aborted
    silent = {r: c for r, c in sorted(out.exits.items()) if c != 0 and r not in reported}
    # SIGTERM is how torchrun stops the survivors of a failure: a consequence, not a cause.
    stopped = {r for r, c in silent.items() if -c in (signal.SIGTERM, signal.SIGINT)}
    killed = {r: c for r, c in silent.items() if c < 0 and r not in stopped}
    if killed:
        errors = [f"rank {r} died without reporting an error: {_exit_text(c)} (torchrun's "
                  "record)" for r, c in killed.items()]
        notes = [f"the other ranks' errors are consequences of that: {e}" for e in out.errors]
        if aborted and not out.errors:
            notes.append(f"{len(aborted)} other rank(s) stopped because of it")
    elif out.errors:
        errors, notes = out.errors[:1], _also(out.errors)
        if aborted or stopped:
            notes.append(f"{len(aborted | stopped)} other rank(s) stopped because "
                         "of it")
    elif silent:
        errors = [f"rank {r} {_exit_text(c)} without reporting an error (torchrun's record)"
                  for r, c in silent.items()]
        notes = out.tail[-10:]
    else:
        errors, notes = (out.aborts or out.tail[-10:] or ["(no output)"]), []
    return [printable(e) for e in errors], [printable(n) for n in notes]


def _stop(proc: Any) -> None:
    """torchrun forwards SIGTERM to its workers; SIGKILL the group if that stalls."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
