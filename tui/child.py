"""One evaluation of a state as the screen needs it, in the worker thread or in a child.

`evaluate_views` simulates a state (ppsim.tui.session.evaluate_state) and builds
what grows with the run: the timeline lanes and the trace comparison. It runs in
the simulation worker thread for small states. A large state (more than
`CHILD_MICROBATCH_STAGES` stage-microbatches, a simulation of about a second) runs
in `SimChild`, a process of its own (multiprocessing, 'spawn'), because a thread
shares the GIL with the screen: freeing a replaced pp 64 x 1024 result alone (millions
of objects) held it 150 ms in one go, so a key press waited that long. The child
sends back a compact result: the summaries, the problem without its schedule's action
lists, the lanes as arrays (ppsim.tui.lanes.LaneOps), the comparison.

A result for a state no longer current is ignored (the app's generation token);
the child lives as long as the app, and is killed when the app is gone.
"""

from __future__ import annotations

import multiprocessing
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any

from ppsim.errors import UserError
from ppsim.sim.engine import Simulation
from ppsim.tui.compare import Comparison, compare
from ppsim.tui.editing import EditRefused
from ppsim.tui.lanes import Lane, pinned_lanes, sim_lanes
from ppsim.tui.session import EditState, Result, collection_paused, evaluate_state

CHILD_MICROBATCH_STAGES = 16_384
"""Above pp x vpp x microbatches the simulation runs in the child process; below it the
worker thread is faster (no transfer) and never holds the screen long."""


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What one simulation hands the screen."""

    result: Result
    """The state's and the pinned split's simulations."""
    lanes: list[Lane]
    """The current split's timeline lanes."""
    pinned_lanes: list[Lane]
    """The pinned split's lanes (pin0, pin1, ...)."""
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
        comparison = compare(result.sim, trace) if trace is not None else None
    return Evaluation(result=result, lanes=lanes, pinned_lanes=pin_l, comparison=comparison)


def slim_simulation(sim: Simulation) -> Simulation:
    """The simulation without what the screen does not read: the per-op records (the
    lanes hold them) and the schedule's action lists (its shape stays)."""
    p = sim.problem
    return Simulation(replace(p, schedule=replace(p.schedule, actions=())), sim.summary, None)


def slim(ev: Evaluation) -> Evaluation:
    """`ev` as the child sends it: small, and quick to unpickle and to free."""
    r = ev.result
    sim = slim_simulation(r.sim)
    pinned = sim if r.pinned is r.sim else slim_simulation(r.pinned)
    return replace(ev, result=replace(r, sim=sim, pinned=pinned))


def serve(conn: Any) -> None:
    """The child's loop: a job (base, state, pinned, trace) in, ("done", Evaluation) or
    ("error", text) out, until the pipe closes."""
    cache: PinnedCache | None = None
    while True:
        try:
            base, state, pinned, trace = conn.recv()
        except (EOFError, OSError):
            return
        try:
            ev = evaluate_views(base, state, pinned, trace, cache)
        except (UserError, EditRefused) as exc:
            conn.send(("error", str(exc)))
            continue
        cache = PinnedCache(sim=ev.result.pinned, lanes=ev.pinned_lanes)
        conn.send(("done", slim(ev)))


class ChildFailed(Exception):
    """The child process ended without an answer."""


class ChildRefused(Exception):
    """The core refused the state in the child; the text is the refusal's own."""


class SimChild:
    """A simulation process started on first use and reused; `evaluate` blocks the
    calling (worker) thread only, waiting on the pipe without the GIL."""

    def __init__(self) -> None:
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()

    def evaluate(self, base: Any, state: EditState, pinned: tuple[int, ...] | None,
                 trace: Any = None) -> Evaluation:
        """The child's Evaluation of the state; UserError with the core's refusal."""
        with self._lock:  # one job at a time (the app runs one simulation at a time)
            conn = self._start()
            try:
                conn.send((base, state, pinned, trace))
                kind, payload = conn.recv()
            except (EOFError, OSError) as exc:
                self.close()
                raise ChildFailed("the simulation process ended") from exc
        if kind == "error":
            raise ChildRefused(payload)
        return payload

    def _start(self) -> Any:
        if self._proc is None or not self._proc.is_alive():
            ctx = multiprocessing.get_context("spawn")
            self._conn, child_end = ctx.Pipe()
            self._proc = ctx.Process(target=serve, args=(child_end,), daemon=True,
                                     name="ppsim-tui-simulation")
            self._proc.start()
            child_end.close()
        return self._conn

    def close(self) -> None:
        """Stop the child (it is started again on the next `evaluate`)."""
        stop(self._proc, self._conn)
        self._proc = self._conn = None


def stop(proc: Any, conn: Any) -> None:
    if conn is not None:
        conn.close()
    if proc is not None and proc.is_alive():
        proc.kill()
        proc.join(5)


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
