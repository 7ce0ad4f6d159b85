"""Every real `ppsim run` the e2e tests read, launched once per session and shared.

Each launch is `ppsim run` in a process forked from this one, which has imported
torch and the modules the ranks use (PRELOAD) once: `ppsim run` forks torchrun
and torchrun forks the ranks, so no launch pays an interpreter's start-up. One
launch also serves several tests: its trace, summary, losses, dumped gradients
and run folder are read by each test that needs that configuration. Extra flags
ride on a case's launch where they do not change what the other tests read
(`--alongside-torch` runs torch's engine in the same processes, `--versus` a
second split). The installed `ppsim` script itself is run as a user runs it by
test_launch_safety.py. The cases themselves (their flags, the files their folders
hold) are in launch_cases.py.

Launches run one at a time, when first asked for: two in flight were no faster on
two cores (the ranks of one launch already keep both busy).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch_cases import SPECS, prepare

from ppsim.executor import forked

ROOT = Path(__file__).resolve().parents[2]


@dataclass(kw_only=True)
class Launch:
    """What one launch left: its exit, output, summary and folder."""

    name: str
    tmp: Path
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    listening: set[str]

    @property
    def summary(self) -> dict[str, Any]:
        assert self.returncode == 0, self.stderr
        return json.loads(self.stdout)


def _proc_tree(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            parents[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parents.items() if pp in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def _ppsim(argv: list[str]) -> Callable[[], int]:
    """`ppsim` with argv, as a ForkedProcess target (its entry point exits the process)."""

    def run() -> int:
        from ppsim.cli.main import entry

        sys.argv = ["ppsim", *argv]
        entry()
        return 0

    return run


def _run(argv: list[str], cwd: Path, env: dict[str, str], watch: bool,
         timeout_s: float = 300) -> tuple[int, str, str, set[str]]:
    """`ppsim` with argv in a process forked from this one (torch and ppsim already
    imported: the CLI's own start-up is not what these tests measure); with `watch`,
    every TCP address its process tree listens on meanwhile."""
    run = Forked(argv, cwd, env)
    seen: set[str] = set()
    end = time.monotonic() + timeout_s
    while run.proc.poll() is None and time.monotonic() < end:
        if watch and shutil.which("ss"):
            pids = _proc_tree(run.proc.pid)
            ss = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
            for line in ss.splitlines():
                if any(int(p) in pids for p in re.findall(r"pid=(\d+)", line)):
                    seen.add(line.split()[3])
        time.sleep(0.1 if watch else 0.02)
    rc, out, err = run.finish(max(0.0, end - time.monotonic()))
    return rc, out, err, seen


class Forked:
    """`ppsim ARGV` running in a process forked from this one, its pipes drained."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = forked.ForkedProcess(_ppsim(argv), env, cwd=str(cwd), stderr_apart=True)
        self._out: dict[str, str] = {}
        self._readers = [threading.Thread(target=lambda k=k, f=f: self._out.__setitem__(
            k, f.read())) for k, f in (("o", self.proc.stdout), ("e", self.proc.stderr))]
        for r in self._readers:  # drain the pipes while it runs: a full pipe would stall it
            r.start()

    def finish(self, timeout_s: float) -> tuple[int, str, str]:
        """Its exit status, stdout and stderr, killed after `timeout_s` more seconds."""
        end = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for r in self._readers:
            r.join(timeout=60)
        assert self.proc.returncode is not None
        return self.proc.returncode, self._out.get("o", ""), self._out.get("e", "")


def launch(name: str, tmp: Path) -> Launch:
    """Run SPECS[name] with `tmp` as its folder."""
    spec = SPECS[name]
    prepare(name, tmp)
    argv = [a.format(tmp=tmp) for a in spec.argv]
    flags = [*argv, *spec.extra]
    if spec.recorded:
        flags += ["--iterations", str(spec.iterations), "--warmup", "1", "--trace-dir",
                  str(tmp / "out"), "--json"]
        if spec.dump_grads:
            flags += ["--dump-grads", str(tmp / "grads")]
    cwd = tmp if spec.in_tmp else ROOT
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **spec.env}
    t0 = time.monotonic()
    rc, so, se, seen = _run(["run", *flags], cwd, env, spec.watch_listen)
    return Launch(name=name, tmp=tmp, argv=argv, returncode=rc, stdout=so, stderr=se,
                  elapsed_s=time.monotonic() - t0, listening=seen)


PRELOAD = ("torch", "torch._dynamo", "torch.distributed.run", "torch.distributed.pipelining",
           "ppsim.cli.main", "ppsim.cli.run", "ppsim.executor.worker", "rich.console",
           "rich.progress", "encodings.idna")
"""What every launch imports (torch's checkpoint and pipelining import torch._dynamo;
`ppsim run` its progress display, and the rendezvous the idna codec)."""


class Pool:
    """The session's launches: each run once, when a test first asks for it."""

    def __init__(self, folder: Any) -> None:
        self.folder = folder  # a callable: name -> a fresh directory
        self.done: dict[str, Launch] = {}
        forked.preload(PRELOAD)

    def get(self, name: str) -> Launch:
        if name not in self.done:
            self.done[name] = launch(name, self.folder(name))
        return self.done[name]

    @staticmethod
    def cli(*argv: str) -> subprocess.CompletedProcess:
        """`ppsim ARGV` from the repository root, forked from this process as the
        launches are (one thread a process; ppsim profile forks its own processes)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        rc, out, err, _ = _run(list(argv), ROOT, env, watch=False)
        return subprocess.CompletedProcess(["ppsim", *argv], rc, out, err)
