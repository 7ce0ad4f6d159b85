"""Point-to-point messages between pipeline ranks: who sends what, in which order,
and the exchange itself (isend/irecv; gloo on CPU, NCCL between GPUs).

Every message is named (kind, destination stage, microbatch) and tagged with that
name's key, and a rank posts its receives from a peer in the order that peer sends
(both follow from the global schedule), so even a backend that ignores tags (NCCL)
pairs them correctly.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from ppsim.executor import progress
from ppsim.executor.recorder import Recorder
from ppsim.pipeline.messages import Message, feeds
from ppsim.schedules.generators import Schedule


def outgoing(schedule: Schedule, rank: int) -> list[tuple[int, Message]]:
    """Messages `rank` sends to other ranks, in the order it sends them."""
    n, out = schedule.num_stages, []
    for a in schedule.actions[rank]:
        msg = feeds(a, n)
        if msg is not None and schedule.stage_rank(msg.stage) != rank:
            out.append((schedule.stage_rank(msg.stage), msg))
    return out


class P2P:
    """Point-to-point exchange of (b, s, h) tensors with the neighbouring ranks."""

    def __init__(self, schedule: Schedule, rank: int, shape: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device, wire: torch.device,
                 recorder: Recorder, lookahead: int = 2, peers: list[int] | None = None
                 ) -> None:
        self.rank, self.schedule, self.rec = rank, schedule, recorder
        self.peers = peers or list(range(schedule.pp))
        """Global rank of each pipeline rank (this replica's)."""
        self.shape, self.dtype, self.device, self.wire = shape, dtype, device, wire
        self.lookahead = lookahead
        self.incoming: dict[int, list[Message]] = defaultdict(list)
        for peer in range(schedule.pp):
            if peer != rank:
                for dst, key in outgoing(schedule, peer):
                    if dst == rank:
                        self.incoming[peer].append(key)
        self.m = schedule.microbatches
        self._reset()

    def _reset(self) -> None:
        self.cursor: dict[int, int] = defaultdict(int)
        self.posted: dict[Message, tuple[Any, torch.Tensor, int]] = {}
        self.sends: list[tuple[Any, torch.Tensor]] = []
        self.local: dict[Message, torch.Tensor] = {}

    def tag(self, key: Message) -> int:
        return key.key(self.m)

    def _post(self, peer: int) -> None:
        key = self.incoming[peer][self.cursor[peer]]
        self.cursor[peer] += 1
        buf = torch.empty(self.shape, dtype=self.dtype, device=self.wire)
        self.posted[key] = (dist.irecv(buf, src=self.peers[peer], tag=self.tag(key)), buf, peer)

    def prefetch(self) -> None:
        """Keep a few receives posted per peer, so data lands while we compute."""
        waiting: dict[int, int] = defaultdict(int)
        for _, _, peer in self.posted.values():
            waiting[peer] += 1
        for peer, keys in self.incoming.items():
            while waiting[peer] < self.lookahead and self.cursor[peer] < len(keys):
                self._post(peer)
                waiting[peer] += 1

    def recv(self, key: Message) -> torch.Tensor:
        if key in self.local:
            return self.local.pop(key)
        peer = self.schedule.stage_rank(key.sender)
        while key not in self.posted:
            self._post(peer)
        work, buf, _ = self.posted.pop(key)
        progress.RANK.wait(True)
        work.wait()
        progress.RANK.wait(False)
        self.rec.recv(now_ns(), key.kind, peer, key.stage, key.microbatch)
        return buf.to(self.device, non_blocking=True)

    def send(self, tensor: torch.Tensor, key: Message, from_stage: int) -> None:
        peer = self.schedule.stage_rank(key.stage)
        if peer == self.rank:  # neighbouring stage on this rank: no transfer
            self.local[key] = tensor.detach()
            return
        t = tensor.detach().to(self.wire).contiguous()
        self.rec.send(self.rec.mark(), key.kind, peer, from_stage, key.stage, key.microbatch,
                      t.numel() * t.element_size())
        self.sends.append((dist.isend(t, dst=self.peers[peer], tag=self.tag(key)), t))

    def finish(self) -> None:
        """End of iteration: every send delivered, every receive consumed."""
        for work, _ in self.sends:
            work.wait()
        if self.posted or self.local:
            raise RuntimeError(f"unconsumed messages at end of iteration: "
                               f"{sorted(self.posted) + sorted(self.local)}")
        self._reset()


def now_ns() -> int:
    """The host clock the recorder's receive times use."""
    return time.perf_counter_ns()
