"""One evaluation of a state as the screen needs it, in the worker thread or in a child.

`evaluate_views` simulates a state (ppsim.tui.session.evaluate_state) and builds
what grows with the run: the timeline lanes and the trace comparison. It runs in
the simulation worker thread for small states. A large state (more than
`CHILD_MICROBATCH_STAGES` stage-microbatches, a simulation of about a second) runs
in `SimChild`, a process of its own (`python -m ppsim.tui.sim_child`), because a thread
shares the GIL with the screen: freeing a replaced pp 64 x 1024 result alone (millions
of objects) held it 150 ms in one go, so a key press waited that long. The child
sends back a compact result: the summaries, the problem without its schedule's action
lists, the lanes as arrays (ppsim.tui.lanes.LaneOps), the comparison.

A result for a state no longer current is ignored (the app's generation token), and
a newer edit kills the job that runs; the child lives as long as the app.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from ppsim.errors import UserError
from ppsim.sim.engine import Simulation
from ppsim.tui.comm_lanes import comm_lanes
from ppsim.tui.compare import Comparison, compare
from ppsim.tui.copy_lanes import copy_lanes
from ppsim.tui.editing import EditRefused
from ppsim.tui.lanes import Lane, pinned_lanes, sim_lanes
from ppsim.tui.session import EditState, Result, evaluate_state

CHILD_MICROBATCH_STAGES = 16_384
"""Above pp x vpp x microbatches the simulation runs in the child process; below it the
worker thread is faster (no transfer) and never holds the screen long."""



@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while a simulation runs in the worker thread.

    A pp 64 x 1024 simulation allocates millions of objects; each full collection
    over them holds the GIL for 100-250 ms (measured with gc.callbacks while
    benchmarks/bench_tui.py ran), so a key press waited that long. Reference counting
    still frees everything; collection resumes after, and the app freezes
    (gc.freeze) what survives each applied result, so later collections do not walk
    the shown result's objects again (reference counting still frees them when the
    next result replaces them)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What one simulation hands the screen."""

    result: Result
    """The state's and the pinned split's simulations."""
    lanes: list[Lane]
    """The current split's timeline lanes."""
    pinned_lanes: list[Lane]
    """The pinned split's lanes (pin0, pin1, ...)."""
    under_lanes: list[Lane]
    """Lanes drawn under their rank's: the host copies (ppsim.tui.copy_lanes) and the
    collectives (ppsim.tui.comm_lanes), built here where the timeline's records are."""
    comparison: Comparison | None
    """The trace comparison, when a trace was given."""


@dataclass(frozen=True, kw_only=True)
class PinnedCache:
    """The lanes last built for a pinned simulation (the pinned split rarely changes)."""

    sim: Simulation
    """The pinned simulation the lanes were built from (compared by identity)."""
    lanes: list[Lane]
    """Its lanes."""


def evaluate_views(base: Any, state: EditState, pinned: tuple[int, ...] | None,
                   trace: Any = None, cache: PinnedCache | None = None) -> Evaluation:
    """Simulate `state` and its pinned split and build the lanes and the comparison.
    UserError or EditRefused when the core refuses the state."""
    with collection_paused():  # see collection_paused: no stall of the screen's thread
        result = evaluate_state(base, state, pinned)
        lanes = sim_lanes(result.sim)
        if cache is not None and cache.sim is result.pinned:
            pin_l = cache.lanes
        else:
            pin_l = pinned_lanes(result.pinned, lanes if result.pinned is result.sim else None)
        under = copy_lanes(result.sim) + comm_lanes(result.sim)
        comparison = compare(result.sim, trace) if trace is not None else None
    return Evaluation(result=result, lanes=lanes, pinned_lanes=pin_l, under_lanes=under,
                      comparison=comparison)


def slim_simulation(sim: Simulation) -> Simulation:
    """The simulation without what the screen does not read: the per-op records (the
    lanes hold them) and the schedule's action lists (its shape stays)."""
    p = sim.problem
    return Simulation(replace(p, schedule=replace(p.schedule, actions=(), recipe=None)),
                      sim.summary, None)


def slim(ev: Evaluation) -> Evaluation:
    """`ev` as the child sends it: small, and quick to unpickle and to free."""
    r = ev.result
    sim = slim_simulation(r.sim)
    pinned = sim if r.pinned is r.sim else slim_simulation(r.pinned)
    return replace(ev, result=replace(r, sim=sim, pinned=pinned))


def serve(stdin: Any, stdout: Any) -> None:
    """The child's loop: a job (base, state, pinned, trace) in, ("done", Evaluation) or
    ("error", text) out, each a length-prefixed pickle, until stdin closes."""
    cache: PinnedCache | None = None
    while True:
        job = read_frame(stdin)
        if job is None:
            return
        base, state, pinned, trace = job
        try:
            ev = evaluate_views(base, state, pinned, trace, cache)
        except (UserError, EditRefused) as exc:
            write_frame(stdout, ("error", str(exc)))
            continue
        cache = PinnedCache(sim=ev.result.pinned, lanes=ev.pinned_lanes)
        write_frame(stdout, ("done", slim(ev)))


def write_frame(out: Any, obj: Any) -> None:
    """One message: its pickle's length (8 bytes) and the pickle, flushed."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(len(data).to_bytes(8, "little") + data)
    out.flush()


def read_frame(stream: Any) -> Any:
    """The next message, None at the end of the stream. The bytes are read first (the
    read waits without the GIL), then unpickled at once."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    size = int.from_bytes(head, "little")
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


class ChildFailed(Exception):
    """The child process ended without an answer."""


class ChildCancelled(Exception):
    """The job was cancelled (`SimChild.cancel`): its answer is not wanted."""


class ChildRefused(Exception):
    """The core refused the state in the child; the text is the refusal's own."""


def start_python(module: str) -> subprocess.Popen:
    """`python -P -m module` with pipes, on this process's import path (not the working
    directory's, unless that is on it). A fresh interpreter, like multiprocessing's
    'spawn', without its re-import of the launching script (a script without a
    `__main__` guard would run again in the child)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen([sys.executable, "-P", "-m", module], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)


class SimChild:
    """A simulation process (`python -m ppsim.tui.sim_child`) started on first use and
    reused; `evaluate` blocks the calling (worker) thread only, waiting on the pipe
    without the GIL. `cancel` kills a running job (the next one starts a new process:
    about 0.2 s, less than waiting for a stale simulation of seconds)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._cancelled = False
        self.running: subprocess.Popen | None = None
        """The process while a job is in flight (what `cancel` kills)."""

    def evaluate(self, base: Any, state: EditState, pinned: tuple[int, ...] | None,
                 trace: Any = None) -> Evaluation:
        """The child's Evaluation of the state; ChildRefused with the core's refusal."""
        with self._lock:  # one job at a time (the app runs one simulation at a time)
            self._cancelled = False
            proc = self._start()
            self.running = proc
            try:
                write_frame(proc.stdin, (base, state, pinned, trace))
                answer = read_frame(proc.stdout)
            except (OSError, ValueError, pickle.UnpicklingError):
                answer = None
            finally:
                self.running = None
            if answer is None:
                self.close()
                if self._cancelled:
                    raise ChildCancelled
                raise ChildFailed("the simulation process ended without an answer")
        kind, payload = answer
        if kind == "error":
            raise ChildRefused(payload)
        return payload

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = start_python("ppsim.tui.sim_child")
        return self._proc

    def cancel(self) -> None:
        """Stop the job that runs, if any (from any thread)."""
        proc = self.running
        if proc is not None:
            self._cancelled = True
            proc.kill()

    def close(self) -> None:
        """Stop the child (it is started again on the next `evaluate`)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    # a job cancelled mid-write leaves bytes that closing would flush
                    # into the killed process: a BrokenPipeError, not the cancellation
                    with contextlib.suppress(OSError):
                        pipe.close()


def child_for(owner: object) -> SimChild:
    """A SimChild that is stopped when `owner` (the app) is garbage-collected or the
    interpreter exits."""
    child = SimChild()
    weakref.finalize(owner, child.close)
    return child


def uses_child(state: EditState) -> bool:
    """True when the state is large enough to simulate in the child process."""
    return state.pp * state.vpp * state.microbatches > CHILD_MICROBATCH_STAGES


def evaluate_anywhere(child: SimChild, base: Any, state: EditState,
                      pinned: tuple[int, ...] | None, trace: Any = None,
                      cache: PinnedCache | None = None) -> Evaluation:
    """`evaluate_views` in the child for a large state, else here; here as well when
    the child cannot run (it died, or processes cannot be started)."""
    if uses_child(state):
        try:
            return child.evaluate(base, state, pinned, trace)
        except (ChildFailed, OSError):
            pass
    return evaluate_views(base, state, pinned, trace, cache)

