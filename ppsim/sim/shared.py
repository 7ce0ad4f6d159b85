"""The simulator when ranks share devices and messages share links.

Same per-rank processes as `ppsim.sim.engine.Engine`, but an op's duration is work on a
device, not a fixed delay: ranks placed on one device share it by processor
sharing (k running ops each progress at 1/k, plus a context-switch cost when an
op starts beside another), and with shared links a message, after its latency,
shares its link's bandwidth with the other messages on it. On CPU every message
also costs compute on the op that sends it and on the op that receives it:
`message_cpu_ms` between devices, `local_message_cpu_ms` between two ranks on one
device (each measured by `ppsim profile` under its own conditions: gloo's threads then
compete with the op for its core). With
a private topology every op runs alone, so each ends at start + work exactly and the
results equal the unshared engine's to the last digit (property-tested). Events are
one heap with monotone ids; a resource's pending completion is invalidated by a version
number when its sharing changes.

It stays a subclass beside `Engine` rather than one loop for both: run on a private
topology it takes about 3.5x the private engine's time (a resource update per op
start and end, five-field events), and `simulate` runs that engine whenever nothing
is shared.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

from ppsim.pipeline.messages import source_stage, target_stage, wire_ms
from ppsim.pipeline.placement import Topology
from ppsim.schedules.generators import Action, Schedule
from ppsim.sim.copies import CopyStreams
from ppsim.sim.engine import Engine, RankRun, Records, Transfer
from ppsim.sim.timing import StageTable

_DEV, _ARRIVE, _ON_LINK, _LINK, _WAKE = 0, 1, 2, 3, 4
"""Event kinds: a device's next completion, a message arrives (private link), a
message reaches its shared link after the latency, a link's next completion, a B's
offloaded tensors are back (ppsim.sim.copies)."""


@dataclass
class SharedResource:
    """Processor sharing: with n jobs each standing for `weight`, every job progresses
    at rate while n x weight <= cores, else at rate x cores / (n x weight) (one
    processor: rate / n)."""

    rate: float = 1.0
    switch_ms: float = 0.0
    """Extra work an op pays when it starts beside another (context switch)."""
    cores: int = 1
    """Processors the jobs share (a pool of CPU cores the OS schedules them on)."""
    weight: int = 1
    """Processes each running job stands for (a rank and its copies: ppsim.pipeline.
    placement.Topology.copies)."""
    jobs: dict[int, float] = field(default_factory=dict)
    """job -> remaining work (at full rate)."""
    since: float = 0.0
    version: int = 0

    def _advance(self, now: float) -> None:
        if self.jobs and now > self.since:
            load = len(self.jobs) * self.weight
            # Written so that one processor's arithmetic is rate / n's to the last digit.
            step = ((now - self.since) * self.rate * self.cores / load if load > self.cores
                    else (now - self.since) * self.rate)
            for j in self.jobs:
                self.jobs[j] -= step
        self.since = now

    def delay(self, work: float) -> float:
        """Time the current sharing takes to do `work` of one job."""
        load = len(self.jobs) * self.weight
        return work * load / (self.rate * self.cores) if load > self.cores else work / self.rate

    def add(self, job: int, work: float, now: float) -> None:
        self._advance(now)
        self.jobs[job] = work + (self.switch_ms if self.jobs else 0.0)
        self.version += 1

    def remove(self, job: int, now: float) -> None:
        self._advance(now)
        del self.jobs[job]
        self.version += 1

    def next_finish(self) -> tuple[float, int] | None:
        """(time, job) of the next job to finish, if any runs."""
        if not self.jobs:
            return None
        job = min(self.jobs, key=lambda j: (self.jobs[j], j))
        # One job alone: exactly since + work (what the unshared engine computes).
        return self.since + self.delay(max(0.0, self.jobs[job])), job


def processor(topo: Topology) -> SharedResource:
    """A fresh resource for one of the topology's compute devices: a device of its own
    processor, or the pool of cores every rank and its copies share."""
    if topo.pooled:
        return SharedResource(switch_ms=topo.context_switch_ms, cores=topo.cores,
                              weight=topo.copies)
    return SharedResource(switch_ms=topo.context_switch_ms)


class InFlight(NamedTuple):
    """A message between its send and its arrival."""

    src: int
    dst: int
    action: Action
    """The op that sent it."""
    sent_at: float
    nbytes: int
    link: int
    """Index of the shared link it crosses; -1: a link of its own."""


class SharedEngine(Engine):
    """The simulator's engine with devices and (optionally) links as shared resources."""

    def __init__(self, schedule: Schedule, table: StageTable, topo: Topology,
                 records: Records | None, copies: CopyStreams | None = None) -> None:
        def private(src: int, dst: int, nbytes: int) -> float:
            return 0.0 if src == dst else topo.link(src, dst).transfer_ms(nbytes)

        super().__init__(schedule, table, private, records, copies)
        self.topo = topo
        self.device_of = topo.compute_devices
        """Rank -> the processor pool its ops run on (its device; one pool for all
        ranks where the topology pools cores)."""
        self.devices = {d: processor(topo) for d in sorted(set(self.device_of))}
        self.links: list[SharedResource] = []
        self.link_index: dict[tuple[str, int, int], int] = {}
        self.sent: dict[int, InFlight] = {}
        """Message key -> the message on its way."""
        self.alone = topo.alone
        """Ranks with a processor to themselves: their ops take exactly their work."""
        self.work = [0.0] * self.pp
        self.charged = bool(topo.message_cpu_ms or topo.local_message_cpu_ms)
        n = schedule.num_stages
        self.message_cpu = {k: [self._cpu(source_stage(k, st, n), st) +
                                self._cpu(st, target_stage(k, st, n)) for st in range(n)]
                            for k in self.table.duration}
        """Kind -> per stage: CPU ms its op pays for the message it receives and the one
        it sends."""

    def _push(self, t: float, event: int, who: int, ver: int) -> None:
        self.ids += 1
        heapq.heappush(self.heap, (t, self.ids, event, who, ver))  # type: ignore[arg-type]

    def wake(self, r: int, t: float) -> None:
        self._push(t, _WAKE, r, 0)

    def _cpu(self, a: int | None, b: int | None) -> float:
        """CPU ms each end pays for a message from stage a to stage b (0: none crossed)."""
        if a is None or b is None:
            return 0.0
        return self.topo.message_cpu(self.owner[a], self.owner[b])

    def run_op(self, r: int, kind: str, st: int, now: float) -> None:
        work = self.op_ms(r, kind, st)
        if self.charged:
            work += self.message_cpu[kind][st]
        d = self.device_of[r]
        self.work[r] = work
        self.devices[d].add(r, work, now)
        self._plan_device(d)

    def _plan_device(self, d: int) -> None:
        nxt = self.devices[d].next_finish()
        if nxt is not None:
            self._push(nxt[0], _DEV, d, self.devices[d].version)

    def finish(self, r: int, now: float) -> None:
        # Wall time, as the executor records it; alone on a device that is the work
        # itself (added as such, so the unshared engine's sums are matched exactly).
        self.busy[r] += self.work[r] if self.alone[r] else now - self.began[r]
        d = self.device_of[r]
        self.devices[d].remove(r, now)
        super().finish(r, now)
        self._plan_device(d)

    def send(self, r: int, dst: int, key: int, bound: int, a: Action, now: float) -> None:
        nbytes = self.table.boundary_bytes[bound]
        if dst == r:
            self.deliver(key, now)
            return
        spec = self.topo.link(r, dst)
        if not self.topo.shared_links or spec.bandwidth_gbps <= 0:
            self.sent[key] = InFlight(r, dst, a, now, nbytes, -1)
            d = spec.transfer_ms(nbytes)
            if d == 0.0:
                self._arrive(key, now)
            else:
                self._push(now + d, _ARRIVE, key, 0)
            return
        i = self.link_index.setdefault(spec.key, len(self.link_index))
        if i == len(self.links):
            self.links.append(SharedResource())
        self.sent[key] = InFlight(r, dst, a, now, nbytes, i)
        self._push(now + spec.latency_ms, _ON_LINK, key, 0)

    def _arrive(self, key: int, now: float) -> None:
        m = self.sent.pop(key)
        if self.records is not None:
            self.records.transfers.append(Transfer(m.src, m.dst, m.action, m.sent_at, now,
                                                   m.nbytes))
        self.deliver(key, now)

    def run(self) -> list[RankRun]:
        for r in range(self.pp):
            if self.acts[r]:
                self.start(r, 0.0)
        heap = self.heap
        while heap:
            now, _, event, who, ver = heapq.heappop(heap)  # type: ignore[misc]
            if event == _DEV:
                dev = self.devices[who]
                if ver == dev.version:  # else its sharing changed since this was planned
                    self.finish(dev.next_finish()[1], now)  # type: ignore[index]
            elif event == _ARRIVE:
                self._arrive(who, now)
            elif event == _WAKE:
                self.woken[who] = True
                self.start(who, now)
            elif event == _ON_LINK:
                m = self.sent[who]
                bandwidth = self.topo.link(m.src, m.dst).bandwidth_gbps
                self.links[m.link].add(who, wire_ms(bandwidth, m.nbytes), now)
                self._plan_link(m.link)
            else:  # a link's next completion
                link = self.links[who]
                if ver == link.version:
                    key = link.next_finish()[1]  # type: ignore[index]
                    link.remove(key, now)
                    self._arrive(key, now)
                    self._plan_link(who)
        return [RankRun(self.ends[r], self.busy[r], self.peak[r], self.peak_in[r], self.pos[r])
                for r in range(self.pp)]

    def _plan_link(self, i: int) -> None:
        nxt = self.links[i].next_finish()
        if nxt is not None:
            self._push(nxt[0], _LINK, i, self.links[i].version)
