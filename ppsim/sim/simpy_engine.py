"""The simulator written in simpy: the readable reference engine (`--engine simpy`).

The same model as the heap engine in `ppsim.sim.engine` (and `ppsim.sim.shared` for
shared placements), with the same numbers to the last digit (property-tested), at a
few times its cost. Read or extend this one; `simulate` returns the same
`Simulation`, so every command can run either. How each rule maps onto simpy:

- **A rank is a process** (`_Model._rank`): it walks its action list in order. An op
  waits for the message carrying its input, then occupies its device for its work.
- **A message is an event** (`_Model._inbox`): one `simpy.Event` per message key,
  made by whichever side comes first; the receiver yields it, arrival triggers it.
  Who feeds whom and the message keys come from `compile_schedule`.
- **A private link is a timeout**: the message arrives `link(src, dst, bytes)` after
  it is sent and the sender goes on at once (isend/irecv: compute and communication
  overlap). A delay of 0 (inside one rank, or free transfers) arrives at once.
- **A device or shared link is a `_Sharing` resource**: processor sharing, not
  simpy's FIFO `Resource`: k jobs on it each progress at 1/k (the arithmetic is
  `SharedResource`'s, the heap engine's own), an op that starts beside another pays
  the context switch, and each message on a shared link first waits out the latency
  (a timeout), then shares the bandwidth. On CPU each message also costs compute on
  the op that sends it and the op that receives it (`Topology.message_cpu`).
- **A combined pair** (Schedule.pairs): its F also yields its B's message before it
  starts, and its own message is sent with the B's when the B ends.
- **Memory**: F allocates its stage's activations when it starts; B allocates its
  transient (what lives only inside it) when it starts and releases it and the activations
  when it ends (all but what W needs, when W is separate), W releases the rest.
- **Host copies** (activation offload): the copy streams' FIFO arithmetic is
  `ppsim.sim.copies.CopyStreams`, the heap engine's own; a B whose tensors are not
  back yet waits for a timeout to their reload's end.

Same instant, same order: where the heap engine does several things at one instant
in one call (an op ends, its message arrives at once and wakes the receiver, then the
sender starts its next op), this model wakes the other process with an URGENT event
(`_at_once`) and steps aside (`_pass`) so that the receiver goes first; a device
plans its next completion once the finishing rank has moved on. Ties at one instant
then resolve as the heap engine resolves them, which is what makes the two agree to
the last digit when ranks share a device.
"""

from __future__ import annotations

import gc
from collections.abc import Generator
from functools import partial
from typing import Any

import simpy
from simpy.events import URGENT

from ppsim.pipeline.placement import Topology
from ppsim.pipeline.problem import Problem
from ppsim.schedules.generators import Action, B, F
from ppsim.sim.copies import CopyStreams, offloads, wake_delay
from ppsim.sim.engine import Op, RankRun, Records, Simulation, Transfer, finished
from ppsim.sim.shared import SharedResource, processor
from ppsim.sim.timing import compile_schedule, in_pairs, p2p_link, stage_table

Process = Generator[simpy.Event, Any, None]


def _at_once(event: simpy.Event) -> simpy.Event:
    """Trigger `event` ahead of everything else due at this instant (simpy's URGENT
    priority, as simpy's own `Initialize` does): the process waiting on it resumes
    before any timeout that ends now."""
    event._ok, event._value = True, None
    event.env.schedule(event, URGENT)
    return event


class _Sharing:
    """A device (or a shared link) as a simpy resource under processor sharing.

    `use(job, work)` returns an event that fires when the job's work is done; the
    holder then calls `replan()` once it has moved on. A planned completion is a
    timeout; when the sharing changes before it fires, it is stale (its version is
    old) and a later plan stands.
    """

    def __init__(self, env: simpy.Environment, state: SharedResource | None = None) -> None:
        self.env = env
        self.state = state or SharedResource()
        self.done: dict[int, simpy.Event] = {}

    def use(self, job: int, work: float) -> simpy.Event:
        self.state.add(job, work, self.env.now)
        done = self.done[job] = self.env.event()
        self.replan()
        return done

    def replan(self) -> None:
        """Plan the next completion: a timeout to `SharedResource.next_finish`'s time."""
        s = self.state
        if not s.jobs:
            return
        assert s.since == self.env.now  # plans follow a change made now
        job = s.next_finish()[1]  # type: ignore[index]
        # next_finish's own arithmetic, as a delay from `since`: now + delay is its time.
        delay = s.delay(max(0.0, s.jobs[job]))
        self.env.timeout(delay).callbacks.append(partial(self._wake, s.version))

    def _wake(self, version: int, _: simpy.Event) -> None:
        s = self.state
        if version != s.version:
            return
        job = s.next_finish()[1]  # type: ignore[index]
        s.remove(job, self.env.now)
        _at_once(self.done.pop(job))


class _Model:
    """One run: the environment, one process per rank, messages and resources."""

    def __init__(self, problem: Problem, record: bool) -> None:
        sched = self.schedule = problem.schedule
        self.env = simpy.Environment(initial_time=0.0)  # times are floats from the start
        self.c = compile_schedule(sched)
        costs = problem.stage_costs
        self.table = stage_table(sched, costs)
        self.copies = CopyStreams(sched.actions, costs, record) if offloads(costs) else None
        pp, self.last = sched.pp, sched.num_stages - 1
        self.owner = [sched.stage_rank(s) for s in range(sched.num_stages)]
        self.pairs = [sched.paired(r) for r in range(pp)]
        """Per rank: positions of the F actions run combined with the B after them."""
        self.together = [in_pairs(sched, r) for r in range(pp)]
        """Per rank: positions of every op in a combined pair (Schedule.pairs)."""
        topo = problem.topology
        # A private placement is the classic model, priced by the hardware's link.
        self.topo: Topology | None = None if topo is None or topo.is_private else topo
        self.delay = p2p_link(problem.hardware.transfer_ms)
        devices = self.topo.compute_devices if self.topo else tuple(range(pp))
        self.devices = {d: _Sharing(self.env, processor(self.topo) if self.topo else None)
                        for d in sorted(set(devices))}
        self.device_of = [self.devices[d] for d in devices]
        # Alone on a device an op takes exactly its work (and busy adds that work).
        self.alone = self.topo.alone if self.topo else (True,) * pp
        self.charged = bool(self.topo and (self.topo.message_cpu_ms
                                           or self.topo.local_message_cpu_ms))
        self.links: dict[tuple[str, int, int], _Sharing] = {}
        self.inbox: dict[int, simpy.Event] = {}
        self.pos, self.ends, self.busy = [0] * pp, [0.0] * pp, [0.0] * pp
        self.began, self.work = [0.0] * pp, [0.0] * pp
        self.act, self.inflight, self.peak, self.peak_in = [0] * pp, [0] * pp, [0] * pp, [0] * pp
        self.ops: list[list[Op]] | None = [[] for _ in range(pp)] if record else None
        self.memory: list[list[tuple[float, int, int]]] = [[] for _ in range(pp)]
        self.transfers: list[Transfer] = []

    def run(self) -> None:
        for r in range(self.schedule.pp):
            self.env.process(self._rank(r))
        self.env.run()

    def _inbox(self, key: int) -> simpy.Event:
        ev = self.inbox.get(key)
        if ev is None:
            ev = self.inbox[key] = self.env.event()
        return ev

    def _pass(self) -> simpy.Event:
        """Step aside: resume after the processes woken at this instant so far."""
        return _at_once(self.env.event())

    def _rank(self, r: int) -> Process:
        """Rank r's process: per op, wait for its input, compute, send its output."""
        dev, n, pairs = self.device_of[r], len(self.c.kind[r]), self.pairs[r]
        for i in range(n):
            waited = False
            # A paired F waits for its B's input too (Schedule.pairs).
            for key in (self.c.wait_key[r][i], self.c.wait_key[r][i + 1]) if i in pairs \
                    else (self.c.wait_key[r][i],):
                if key >= 0 and not self._inbox(key).triggered:
                    if i and not waited:
                        dev.replan()  # the device goes on without this rank
                    waited = True
                    yield self._inbox(key)
            if self.copies is not None and self.c.kind[r][i] == B:
                a = self.schedule.actions[r][i]
                ready = self.copies.reload_end(r, a.stage, a.microbatch, self.env.now)
                if ready > self.env.now:  # its offloaded tensors are still on their way
                    # The wait is scheduled before the device plans its next completion,
                    # as the heap engine pushes the wake-up before it replans the device.
                    wait = self.env.timeout(wake_delay(self.env.now, ready))
                    if i and not waited:
                        dev.replan()
                    yield wait
            yield self._start(r, i, dev)
            if self._finish(r, i):
                yield self._pass()  # its receiver starts first
        if n:
            dev.replan()

    def _start(self, r: int, i: int, dev: _Sharing) -> simpy.Event:
        """Op i of rank r starts now: F allocates, B its transient; the op occupies the
        device."""
        kind, st, now = self.c.kind[r][i], self.c.stage[r][i], self.env.now
        if self.copies is not None and kind in (F, B):  # the copies' changes go first
            self._settle(r, now)
        if kind == F:
            act = self.act[r] = self.act[r] + self.table.alloc[st]
            inflight = self.inflight[r] = self.inflight[r] + 1
            self.peak[r] = max(self.peak[r], act)
            self.peak_in[r] = max(self.peak_in[r], inflight)
            if self.ops is not None:
                self.memory[r].append((now, act, inflight))
        elif kind == B and self.table.transient[st]:  # held until the B ends
            act = self.act[r] = self.act[r] + self.table.transient[st]
            self.peak[r] = max(self.peak[r], act)
            if self.ops is not None:
                self.memory[r].append((now, act, self.inflight[r]))
        self.began[r] = now
        if self.copies is not None:
            self.copies.op_started(r, i, now)
            self._settle(r, now)
        work = self.table.op_ms(kind, st, i in self.together[r])
        if self.charged:
            # F receives from the stage before and sends to the next; B the other way.
            step = 1 if kind == F else -1 if kind == B else 0
            if step:
                work += self._cpu(st - step, st) + self._cpu(st, st + step)
        self.work[r] = work
        return dev.use(r, work)

    def _settle(self, r: int, now: float) -> None:
        """Apply the copies' memory changes on rank r due by now (CopyStreams.settle)."""
        assert self.copies is not None
        self.act[r], self.peak[r] = self.copies.settle(
            r, now, self.act[r], self.peak[r], self.memory[r] if self.ops is not None
            else None, self.inflight[r])

    def _cpu(self, a: int, b: int) -> float:
        """CPU ms each end pays for a message from stage a to stage b (0: none crosses)."""
        if not 0 <= a <= self.last or not 0 <= b <= self.last:
            return 0.0
        assert self.topo is not None
        return self.topo.message_cpu(self.owner[a], self.owner[b])

    def _finish(self, r: int, i: int) -> bool:
        """Op i of rank r ends now: free memory, send its message. True: it arrived now."""
        kind, st, now = self.c.kind[r][i], self.c.stage[r][i], self.env.now
        # Wall time, as the executor records it; alone, the work itself (same sums).
        self.busy[r] += self.work[r] if self.alone[r] else now - self.began[r]
        released = self.table.free[kind][st]
        if self.copies is not None and (released or kind == B):
            self._settle(r, now)
        if released or kind == B:
            self.act[r] -= released
            self.peak[r] = max(self.peak[r], self.act[r])  # B may keep more for W than it frees
            self.inflight[r] -= kind == B
            if self.ops is not None:
                self.memory[r].append((now, self.act[r], self.inflight[r]))
        a = self.schedule.actions[r][i]
        if self.ops is not None:
            self.ops[r].append(Op(r, a, st // self.schedule.pp, self.began[r], now))
        self.pos[r] += 1
        self.ends[r] = now
        if self.copies is not None and kind == F:
            self.copies.forward_ended(r, st, a.microbatch, now)
        pairs = self.pairs[r]
        if i in pairs:  # a paired F's message leaves with its B's, when the B ends
            return False
        at_once = False
        for j in (i - 1, i) if i - 1 in pairs else (i,):
            key = self.c.send_key[r][j]
            if key >= 0:
                nbytes = self.table.boundary_bytes[self.c.send_stage[r][j]]
                at_once |= self._send(r, self.c.send_rank[r][j], key, nbytes,
                                      self.schedule.actions[r][j])
        return at_once

    def _send(self, r: int, dst: int, key: int, nbytes: int, a: Action) -> bool:
        """Hand a message to its link; True when it arrived at once."""
        if dst == r:  # a boundary inside one rank (V placement): nothing crosses
            _at_once(self._inbox(key))
            return True
        sent = (r, dst, a, self.env.now, nbytes)
        if self.topo is None:
            delay = self.delay(r, dst, nbytes)
        else:
            spec = self.topo.link(r, dst)
            if self.topo.shared_links and spec.bandwidth_gbps > 0:
                latency = self.env.timeout(spec.latency_ms)  # queued now, as sent
                self.env.process(self._carry(sent, key, latency, spec.key,
                                             nbytes / (spec.bandwidth_gbps * 1e6)))
                return False
            delay = spec.transfer_ms(nbytes)
        if delay == 0.0:
            self._arrive(sent, key)
            return True
        self.env.timeout(delay).callbacks.append(lambda _: self._arrive(sent, key))
        return False

    def _carry(self, sent: tuple, key: int, latency: simpy.Event,
               link_key: tuple[str, int, int], work: float) -> Process:
        """A message on a shared link: the latency, then its share of the bandwidth."""
        yield latency
        link = self.links.get(link_key)
        if link is None:
            link = self.links[link_key] = _Sharing(self.env)
        yield link.use(key, work)
        self._arrive(sent, key)
        yield self._pass()
        link.replan()

    def _arrive(self, sent: tuple, key: int) -> None:
        if self.ops is not None:
            self.transfers.append(Transfer(*sent[:4], self.env.now, sent[4]))
        _at_once(self._inbox(key))


def simulate(problem: Problem, record: bool = True) -> Simulation:
    """Simulate one iteration of a resolved problem in simpy (see the module docstring).

    With record=False no per-op records are kept (timeline None).
    """
    m = _Model(problem, record)
    # Millions of short-lived events: the cyclic GC would only rescan them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        m.run()
    finally:
        if enabled:
            gc.enable()
    ranks = [RankRun(m.ends[r], m.busy[r], m.peak[r], m.peak_in[r], m.pos[r])
             for r in range(problem.schedule.pp)]
    records = None
    if m.ops is not None:
        records = Records(problem.schedule.pp)
        records.ops, records.transfers, records.memory = m.ops, m.transfers, m.memory
        if m.copies is not None and m.copies.copies is not None:
            records.copies = m.copies.copies
    return finished(problem, m.table.static, ranks, records)
